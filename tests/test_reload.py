"""Configuration reload on a running gateway, with real upstreams and a client connected throughout."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import mcp_types as types
import pytest
import yaml
from mcp import Client
from mcp.client.session import IncomingMessage

from agent_gateway import reload as reload_module
from agent_gateway.config_files import load_config
from agent_gateway.http import build_app
from agent_gateway.reload import Reloader
from agent_gateway.server import Gateway
from tests.support import RunningGateway, free_port, gateway_env, python_upstream, serving
from tests.test_upstreams import pid_alive

AGENT_GATEWAY = str(Path(sys.executable).parent / "agent-gateway")
BOUND = 30.0


LAUGHS = (
    "a0: &a0 ["
    + ", ".join(["x"] * 10)
    + "]\n"
    + "".join(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]\n" for n in range(1, 7))
)
"""A few hundred bytes of YAML whose aliases expand to ten million values."""


def counter(**extra: Any) -> dict[str, Any]:
    return python_upstream("counter.py", **extra)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def write(path: Path, upstreams: dict[str, Any], **top: Any) -> Path:
    path.write_text(yaml.safe_dump({"upstreams": upstreams, **top}), encoding="utf-8")
    return path


@asynccontextmanager
async def from_file(path: Path) -> AsyncIterator[tuple[RunningGateway, Reloader]]:
    """A gateway on the file at ``path``, served over HTTP, with its reloader."""
    gateway = Gateway(load_config(path, {}))
    async with gateway.running(), serving(build_app(gateway)) as base:
        gw = RunningGateway(gateway, f"{base}/mcp", base)
        yield gw, Reloader(gateway, lambda: load_config(path, {}), str(path))


async def test_added_removed_and_changed_upstreams_apply_while_sessions_and_the_rest_go_on(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "g.yaml", {"keep": counter(), "change": counter(), "drop": counter()})
    changed = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with (
        from_file(path) as (gw, reloader),
        Client(gw.url, mode="legacy", message_handler=on_message) as client,
    ):
        session = next(iter(gw.gateway.sessions.live))
        kept_pid = int(text_of(await client.call_tool("keep__pid", {})))
        changed_pid = int(text_of(await client.call_tool("change__pid", {})))
        dropped_pid = int(text_of(await client.call_tool("drop__pid", {})))
        assert text_of(await client.call_tool("keep__increment", {})) == "1"

        write(path, {"keep": counter(), "change": counter(timeout=7, exclude=["crash"]), "add": counter()})
        found = await reloader.reload()

        assert found is not None
        assert (found.added, found.removed, found.changed, found.unchanged) == (
            ("add",),
            ("drop",),
            ("change",),
            ("keep",),
        )
        with anyio.fail_after(BOUND):
            await changed.wait()  # the same session was told, and goes on
            # Told at the first change: the restarted and added upstreams list theirs once up.
            while not {"change__pid", "add__pid"} <= (
                names := {t.name for t in (await client.list_tools()).tools}
            ):
                await anyio.sleep(0.05)
        assert "keep__pid" in names
        assert not {n for n in names if n.startswith("drop__")}
        assert "change__crash" not in names
        assert "keep__crash" in names
        # Untouched: the same process, its state kept; restarted: a new one; removed: reaped.
        assert int(text_of(await client.call_tool("keep__pid", {}))) == kept_pid
        assert text_of(await client.call_tool("keep__increment", {})) == "2"
        assert int(text_of(await client.call_tool("change__pid", {}))) != changed_pid
        assert not text_of(await client.call_tool("add__increment", {})).startswith("Unknown")
        assert not pid_alive(dropped_pid)
        assert not pid_alive(changed_pid)
        assert list(gw.gateway.sessions.live) == [session]
        assert gw.gateway.pool.get("keep").connections == 1
        dropped = await client.call_tool("drop__pid", {})
        assert dropped.is_error


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("upstreams:\n  keep: {command: x}\n  keep: {command: y}\n", "line 3: duplicate key 'keep'"),
        ("upstreams:\n  keep: {command: x, timout: 3}\n", "upstreams.keep.timout: unknown key 'timout'"),
        # Each of these ended the gateway (its reload's exception left the serving task group).
        ("upstreams:\n  keep: {command: caf\xe9}\n".encode("latin-1"), "not UTF-8 text (byte 32"),
        ("x: &a [*a]\n", "nests deeper than 64 levels (an alias that holds itself?)"),
        ("x: " + "[" * 3000 + "]" * 3000 + "\n", "nests too deeply to read"),
        ("x: " + "9" * 5000 + "\n", "holds a value that cannot be read: Exceeds the limit (4300 digits)"),
        (LAUGHS, "holds more than 100,000 values once its YAML aliases are expanded"),
        # Read whole, a file this size (a log written over it, say) held the reload for minutes.
        ("upstreams: {}\nx: '" + "a" * (16 * 2**20) + "'\n", "larger than 16 MiB; is it the configuration?"),
    ],
    ids=[
        "repeated-key",
        "unknown-key",
        "latin-1",
        "alias-of-itself",
        "3000-levels",
        "5000-digits",
        "aliases",
        "over-16-MiB",
    ],
)
async def test_a_bad_new_config_is_refused_in_one_line_and_the_running_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str | bytes, reason: str
) -> None:
    path = write(tmp_path / "g.yaml", {"keep": counter()})
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        pid = text_of(await client.call_tool("keep__pid", {}))
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert await reloader.reload() is None
        assert text_of(await client.call_tool("keep__pid", {})) == pid
    [refused] = [r for r in caplog.records if r.getMessage().startswith("reload refused")]
    assert refused.levelno == logging.ERROR
    assert reason in refused.getMessage()
    assert "\n" not in refused.getMessage()


async def test_clients_are_answered_while_a_reload_reads_a_large_file(tmp_path: Path) -> None:
    # The file was read and parsed on the event loop: a 2 MB list held every client's calls
    # (and SIGTERM) for minutes. Now a call made while the reload reads is answered first.
    path = write(tmp_path / "g.yaml", {"keep": counter()})
    order: list[str] = []
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        pid = text_of(await client.call_tool("keep__pid", {}))
        path.write_text("upstreams: {}\nx: [" + ",".join(["1"] * 60_000) + "]\n")

        async def reload() -> None:
            order.append("reload refused" if await reloader.reload() is None else "reload applied")

        async with anyio.create_task_group() as tg:
            tg.start_soon(reload)
            await anyio.lowlevel.checkpoint()  # the reload task is reading
            assert text_of(await client.call_tool("keep__pid", {})) == pid
            order.append("call answered")
    assert order == ["call answered", "reload refused"]  # x: unknown key, once it was read


async def test_a_change_to_a_section_read_at_start_up_only_is_logged_by_name_and_not_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "g.yaml", {"keep": counter()}, search={"mode": "on"})
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        before = sorted(t.name for t in (await client.list_tools()).tools)
        same = await reloader.reload()  # every section compares equal when nothing changed
        assert same is not None
        assert same.needs_restart == ()
        write(path, {"keep": counter()}, search={"mode": "off"}, audit={"path": str(tmp_path / "a.jsonl")})
        found = await reloader.reload()
        assert found is not None
        assert found.needs_restart == ("search", "audit")
        assert sorted(t.name for t in (await client.list_tools()).tools) == before  # still searching
    [warned] = [r for r in caplog.records if "read at start-up only" in r.getMessage()]
    assert warned.levelno == logging.WARNING
    assert "search, audit changed" in warned.getMessage()


async def test_a_rename_keeps_the_connection_and_one_that_collides_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "g.yaml", {"a": counter(), "b": counter()})
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        pid = text_of(await client.call_tool("a__pid", {}))
        write(path, {"a": counter(rename={"pid": "process"}), "b": counter()})
        found = await reloader.reload()
        assert found is not None
        assert (found.renamed, found.changed) == (("a",), ())
        assert text_of(await client.call_tool("a__process", {})) == pid  # the same process

        write(path, {"a": counter(prefix=False), "b": counter(prefix=False), "c": counter()})
        assert await reloader.reload() is None
        assert text_of(await client.call_tool("a__process", {})) == pid
        assert "c" not in gw.gateway.pool.upstreams


# -- the serve process: SIGHUP and --watch ------------------------------------------------------


@asynccontextmanager
async def serving_process(path: Path, *flags: str) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    port = load_config(path, {}).server.port
    process = subprocess.Popen([AGENT_GATEWAY, "serve", "-c", str(path), *flags], env=gateway_env())
    base = f"http://127.0.0.1:{port}"
    try:
        yield process, base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


async def upstream_names(http: httpx.AsyncClient, base: str) -> set[str]:
    try:
        answer = await http.get(f"{base}/readyz")
    except httpx.TransportError:
        return set()
    return {u["name"] for u in json.loads(answer.text)["upstreams"] if u["state"] == "up"}


async def until_upstreams(http: httpx.AsyncClient, base: str, expected: set[str]) -> None:
    with anyio.fail_after(BOUND):
        while await upstream_names(http, base) != expected:
            await anyio.sleep(0.1)


@pytest.mark.parametrize("how", ["sighup", "watch"])
async def test_serve_applies_an_edited_file_on_sighup_or_with_watch(tmp_path: Path, how: str) -> None:
    port = free_port()
    path = write(tmp_path / "g.yaml", {"one": counter()}, server={"port": port})
    flags = ["--watch"] if how == "watch" else []
    async with serving_process(path, *flags) as (process, base), httpx.AsyncClient() as http:
        await until_upstreams(http, base, {"one"})
        write(path, {"two": counter()}, server={"port": port})
        if how == "sighup":
            process.send_signal(signal.SIGHUP)
        await until_upstreams(http, base, {"two"})
        assert process.poll() is None


@pytest.mark.parametrize(
    ("seconds", "outcome"),
    [(0.5, "slept 0.5s"), (30, "stopped by a configuration reload")],
    ids=["ends-in-time", "outlasts-it"],
)
async def test_a_call_in_flight_on_a_removed_upstream_is_given_the_drain_timeout_then_told_why(
    tmp_path: Path, seconds: float, outcome: str
) -> None:
    # A reload cut the calls in flight on an upstream it removed or changed at once, with a
    # bare "Connection closed" that read as the upstream's crash.
    path = write(
        tmp_path / "g.yaml",
        {"keep": counter(), "slow": python_upstream("faulty.py")},
        server={"drain_timeout": 2},
    )
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as client:
        answers: list[types.CallToolResult] = []

        async def call() -> None:
            answers.append(await client.call_tool("slow__slow", {"seconds": seconds}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(BOUND):
                while gw.gateway.pool.get("slow").guard.in_flight == 0:
                    await anyio.sleep(0.02)
            write(path, {"keep": counter()}, server={"drain_timeout": 2})
            assert await reloader.reload() is not None
        assert text_of(await client.call_tool("keep__increment", {})) == "1"
    [answer] = answers
    assert outcome in text_of(answer)


async def test_a_reload_adding_an_upstream_that_never_answers_is_done_in_seconds_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reload waited out the new upstream's connect_timeout (60 s), saying nothing, and
    # every reload after it waited behind it. Its bound is what is tested, not its 5 s.
    monkeypatch.setattr(reload_module, "SETTLE_WAIT", 1.0)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def silent(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with anyio.CancelScope() as scope:
                accepted.append(scope)
                async for _ in stream:  # reads the request, answers nothing
                    pass

    accepted: list[anyio.CancelScope] = []
    path = write(tmp_path / "g.yaml", {"keep": counter()})
    silent_upstream = {"url": f"http://127.0.0.1:{port}/mcp", "connect_timeout": 60}
    async with (
        listener,
        anyio.create_task_group() as tg,
        from_file(path) as (gw, reloader),
        Client(gw.url, mode="legacy") as client,
    ):
        tg.start_soon(listener.serve, silent)
        write(path, {"keep": counter(), "silent": silent_upstream})
        with anyio.fail_after(BOUND):  # well inside the silent one's connect_timeout
            added = await reloader.reload()
            assert added is not None
            assert added.added == ("silent",)
            assert accepted  # it was reached, and never answered
            assert str(gw.gateway.pool.get("silent").state) == "connecting"
            write(path, {"keep": counter()})
            assert await reloader.reload() is not None  # the next reload is not held behind it
        assert text_of(await client.call_tool("keep__increment", {})) == "1"
        tg.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.reload"]
    assert "reload: silent not connected within 1 s; applied, connecting on in the background" in said


async def test_a_dedicated_session_opened_while_a_reload_drains_is_the_new_upstreams_and_kept(
    tmp_path: Path,
) -> None:
    # A per_client upstream a reload restarts is the pool's at once, its old one draining: a
    # session a client opened meanwhile took the old configuration with the new upstream's
    # slots, and the end of the drain closed it with the old one's sessions (the client's
    # upstream state, here its process, gone with it).
    slow = python_upstream("faulty.py") | {"session": "per_client"}
    path = write(tmp_path / "g.yaml", {"slow": slow}, server={"drain_timeout": BOUND})
    async with (
        from_file(path) as (gw, reloader),
        Client(gw.url, mode="legacy") as holder,
        Client(gw.url, mode="legacy") as other,
    ):
        pool = gw.gateway.pool
        old = pool.get("slow")
        first = ""
        async with anyio.create_task_group() as reloading, anyio.create_task_group() as holding:
            holding.start_soon(holder.call_tool, "slow__slow", {"seconds": BOUND})  # holds the drain
            with anyio.fail_after(BOUND):
                while old.guard.in_flight == 0:
                    await anyio.sleep(0.02)
            # A call waits for a restarted upstream's first connection, its timeout at most.
            write(path, {"slow": slow | {"timeout": 2}}, server={"drain_timeout": BOUND})
            reloading.start_soon(reloader.reload)
            with anyio.fail_after(BOUND):
                while pool.upstreams["slow"] is old:
                    await anyio.sleep(0.02)
            first = text_of(await other.call_tool("slow__pid", {}))  # opened while old drains
            assert old.guard.in_flight == 1
            holding.cancel_scope.cancel()  # the holder's call ends: so does the drain
        assert text_of(await other.call_tool("slow__pid", {})) == first
        assert [s.config.timeout for s in gw.gateway.dedicated.live if s.owner is not None] == [2.0]
