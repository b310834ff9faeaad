"""An upstream a configuration reload restarts: its tools stay listed and callable throughout."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import mcp_types as types
from mcp import Client
from mcp.client.session import IncomingMessage

from tests.test_reload import BOUND, counter, from_file, text_of, write
from tests.test_upstreams import pid_alive


async def test_a_restarted_upstreams_tools_stay_callable_and_clients_are_not_told_of_it(
    tmp_path: Path,
) -> None:
    # Its part of the catalog was dropped at the reload and listed again once it was back:
    # calls meanwhile were told "Unknown tool" (fail_open promises a down upstream's tools stay
    # listed), and every client was told tools/list_changed twice for the same list.
    path = write(tmp_path / "g.yaml", {"keep": counter(), "change": counter()})
    told: list[str] = []
    answers: list[types.CallToolResult] = []

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told.append("tools")

    async with (
        from_file(path) as (gw, reloader),
        Client(gw.url, mode="legacy", message_handler=on_message) as client,
        Client(gw.url, mode="legacy") as bystander,
    ):
        old_pid = int(text_of(await client.call_tool("change__pid", {})))
        reloaded, found = anyio.Event(), None

        async def calling() -> None:  # the bystander, calling the restarted upstream throughout
            while not reloaded.is_set():
                answers.append(await bystander.call_tool("change__pid", {}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(calling)
            write(path, {"keep": counter(), "change": counter(timeout=7)})
            found = await reloader.reload()
            reloaded.set()
        assert found is not None
        assert found.changed == ("change",)
        with anyio.fail_after(BOUND):
            while (now := await client.call_tool("change__pid", {})).is_error:
                await anyio.sleep(0.05)  # connecting on after the reload's own wait
        new_pid = int(text_of(now))
        assert new_pid != old_pid
        assert not pid_alive(old_pid)
        assert gw.gateway.pool.get("change").config.timeout == 7
        # A change a client must be told of, after the reload: the only notice it gets.
        await client.call_tool("keep__add_tool", {"name": "marker"})
        with anyio.fail_after(BOUND):
            while not told:
                await anyio.sleep(0.05)
            while "keep__marker" not in {t.name for t in (await client.list_tools()).tools}:
                await anyio.sleep(0.05)
    assert answers
    # Each call waited for it (or, if one did not, was told why): none was an unknown tool.
    errors = [text_of(a) for a in answers if a.is_error]
    assert [e for e in errors if "configuration reload" not in e] == []
    assert told == ["tools"]
    served = {int(text_of(a)) for a in answers if not a.is_error}
    assert served <= {old_pid, new_pid}


async def test_a_restarted_upstream_whose_kept_tools_collide_under_the_new_names_is_listed_again_or_refused(
    tmp_path: Path,
) -> None:
    # The reload keeps a restarted (fail_open) upstream's tools listed; when they collide under
    # the reloaded names, the reload is applied without them (the collision is not the running
    # catalog's), and the upstream's own listing, once it is back, meets the catalog as any
    # later listing does: refused and reported, the rest served; a further reload repairs it.
    path = write(tmp_path / "g.yaml", {"a": counter(), "b": counter()})
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        b_pid = text_of(await client.call_tool("b__pid", {}))
        write(path, {"a": counter(prefix=False, timeout=7), "b": counter(prefix=False)})
        found = await reloader.reload()
        assert found is not None  # applied, not refused as a plain rename's collision is
        assert found.changed == ("a",)
        assert text_of(await client.call_tool("pid", {})) == b_pid
        with anyio.fail_after(BOUND):
            while "a" not in gw.gateway.catalog.problems:
                await anyio.sleep(0.05)  # a's own listing, once it is back
        assert "upstream 'b'" in gw.gateway.catalog.problems["a"]
        assert text_of(await client.call_tool("pid", {})) == b_pid  # b's, still
        assert gw.gateway.pool.get("a").config.timeout == 7

        write(path, {"a": counter(timeout=7), "b": counter(prefix=False)})
        assert await reloader.reload() is not None
        with anyio.fail_after(BOUND):
            while (answer := await client.call_tool("a__pid", {})).is_error:
                await anyio.sleep(0.05)
        assert text_of(answer) != b_pid
        assert "a" not in gw.gateway.catalog.problems


async def test_a_listing_refused_at_run_time_is_reported_by_upstream_and_served_once_a_reload_repairs_it(
    tmp_path: Path,
) -> None:
    # A refused listing was dropped: the status said nothing of it (a log line only), and a
    # reload renaming the colliding tool left the tool out until its upstream listed again.
    apart = {"rename": {"increment": "a_increment", "pid": "a_pid", "add_tool": "a_add", "crash": "a_crash"}}
    path = write(tmp_path / "g.yaml", {"a": counter(prefix=False, **apart), "b": counter(prefix=False)})
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        await client.call_tool("a_add", {"name": "marker"})
        with anyio.fail_after(BOUND):  # a's listing is taken first: its tool is the one kept
            while "marker" not in gw.gateway.catalog.snapshot.tools:
                await anyio.sleep(0.05)
        await client.call_tool("add_tool", {"name": "marker"})  # b's: a's public name
        with anyio.fail_after(BOUND):
            while "b" not in gw.gateway.catalog.problems:
                await anyio.sleep(0.05)
        assert text_of(await client.call_tool("a_pid", {})) != text_of(await client.call_tool("pid", {}))
        marker = await client.call_tool("marker", {})  # a's, kept; b's earlier listing served
        (status,) = [u for u in gw.gateway.status()["upstreams"] if u["name"] == "b"]  # type: ignore[attr-defined]
        assert "'marker'" in status["listing_refused"]
        async with httpx.AsyncClient() as http:
            page = (await http.get(f"{gw.base}/")).text
        assert "latest listing refused: " in page

        b = counter(prefix=False, rename={"marker": "b_marker"})
        write(path, {"a": counter(prefix=False, **apart), "b": b})
        assert await reloader.reload() is not None
        assert text_of(await client.call_tool("b_marker", {})) == "marker"  # b's, at once
        assert "b" not in gw.gateway.catalog.problems
        (status,) = [u for u in gw.gateway.status()["upstreams"] if u["name"] == "b"]  # type: ignore[attr-defined]
        assert status["listing_refused"] is None
    assert text_of(marker) == "marker"
    assert gw.gateway.catalog.snapshot.tools["marker"].upstream == "a"
