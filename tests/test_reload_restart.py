"""An upstream a configuration reload restarts: its tools stay listed and callable throughout."""

from __future__ import annotations

from pathlib import Path

import anyio
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
