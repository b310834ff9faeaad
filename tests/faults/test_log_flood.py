"""An upstream writing log lines faster than its clients read them holds a bounded number of
them in the gateway, whoever they are for, and the clients that do read still get lines.

The SDK's client starts a task for each notification an upstream sends (mcp 2.3:
``JSONRPCDispatcher._dispatch_notification``), and each waited until its clients took the
line, up to ``SEND_TIMEOUT`` a client: the lines of a call whose client reads nothing held
one task (and one line) each, thousands at the peak, and a line no call owns was sent to the
clients one after another, so a client not reading held every line for the others. The
clients the lines wait for here read nothing (raw streams left unread: once the sockets to
them are full, every send to them waits), so the lines wait in the gateway however loaded the
machine is; a client reading them as they come keeps up, and the old code then passed. The
upstream is ``tests/servers/noisy.py`` over stdio; it writes its lines on the pipe its next
answer comes on, so once that answer is in, the gateway has read every line.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import yaml
from mcp import Client
from mcp.client.session import LoggingFnT

from agent_gateway.downstream.broadcast import MAX_DATA
from tests.faults.harness import text_of
from tests.support import SERVERS, child_process, free_port, gateway_env, ready

BOUND = 90.0
"""Against a hang."""
LINES = 3000
"""At the upstream's ``notification_rate`` (1,000 a second, 1,000 at once), two seconds of
lines at least: ``/status``, rendered at most once a second, is rendered while they are read,
and some 300 of them are lines no call owns passed on (``broadcast.RATE``: 100 a second)."""
SIZE = 64_000
"""Characters a line (under ``MAX_DATA``: passed on whole): the sockets to a client that reads
nothing hold about 100 of them (Linux's default buffers), then every send to it waits."""
SPARE_TASKS = 50
"""Tasks the flood may add (besides a call's lines being passed on): a client's lines being
sent to it, and a few being read. Before, one a line still being passed on: some 250 lines no
call owns, 2,900 lines of a call (and 220 MB)."""
PASSING = 64
"""A call's lines passed on at once (``upstreams.replies.MAX_PASSING``: not imported, as its
break patch changes it)."""
UNREAD = 4
"""Clients listening for lines no call owns on a stream they never read."""
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
NOISY = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}

Status = Callable[[], Awaitable[dict[str, Any]]]


@asynccontextmanager
async def noisy_gateway(tmp_path: Path) -> AsyncIterator[tuple[str, Status]]:
    """A gateway process (its clients in another, as deployed: their reading is not the
    gateway's loop's) on two noisy upstreams: its MCP URL, and its ``/status``."""
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump({"server": {"port": port}, "upstreams": {"noisy": NOISY, "calm": NOISY}})
    )
    command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(config)]
    async with (
        child_process(command, gateway_env(), tmp_path / "gateway.log"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=BOUND) as http,
    ):
        await ready(port)

        async def status() -> dict[str, Any]:
            return dict((await http.get("/status")).json())

        yield f"http://127.0.0.1:{port}/mcp", status


async def status_after(status: Status, calls: int) -> dict[str, Any]:
    """The first ``/status`` rendered once the gateway has answered ``calls`` calls (it is
    rendered at most once a second: one asked for sooner is an older one's)."""
    while (now := await status())["calls"] < calls:
        await anyio.sleep(0.05)
    return now


async def handshake(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A handshake-era session opened with raw requests: the headers of its requests."""
    hello = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    }
    opened = await http.post(
        url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=HEADERS
    )
    headers = HEADERS | {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


@asynccontextmanager
async def unread_stream(http: httpx.AsyncClient, url: str) -> AsyncIterator[None]:
    """A new session's stream of what no call owns, open and never read."""
    headers = await handshake(http, url) | {"Accept": "text/event-stream"}
    async with http.stream("GET", url, headers=headers) as stream:
        assert stream.status_code == 200
        yield


def hearing(heard: list[str]) -> LoggingFnT:
    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))

    return on_log


async def test_lines_no_call_owns_hold_one_task_a_client_not_one_a_line(tmp_path: Path) -> None:
    heard: list[str] = []
    async with (
        noisy_gateway(tmp_path) as (url, status),
        httpx.AsyncClient(timeout=BOUND) as http,
        AsyncExitStack() as stack,
    ):
        for _ in range(UNREAD):  # listeners that read nothing: once their sockets are full, sends wait
            await stack.enter_async_context(unread_stream(http, url))
        # Opened last: sent a line after the others, when they are sent one after another.
        reader = await stack.enter_async_context(Client(url, mode="legacy", logging_callback=hearing(heard)))
        with anyio.fail_after(BOUND):
            assert text_of(await reader.call_tool("noisy__flood", {"lines": LINES, "size": SIZE})) == "flood"
            before = (await status_after(status, 1))["tasks"]
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                await reader.set_logging_level("debug")  # answered once the gateway has read the flood
            assert text_of(await reader.call_tool("calm__echo", {"text": "bystander"})) == "bystander"
            added = (await status_after(status, 2))["tasks"] - before
            assert added < SPARE_TASKS, added
            while not heard:  # the client that reads gets lines
                await anyio.sleep(0.01)


async def test_lines_of_a_call_are_passed_on_a_bounded_number_at_once(tmp_path: Path) -> None:
    async with (
        noisy_gateway(tmp_path) as (url, status),
        httpx.AsyncClient(timeout=BOUND) as http,
        Client(url, mode="legacy") as bystander,
    ):
        headers = await handshake(http, url)
        flood = {"name": "noisy__flood", "arguments": {"lines": LINES, "size": SIZE, "during": True}}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": flood}
        with anyio.fail_after(BOUND):
            assert text_of(await bystander.call_tool("calm__echo", {"text": "before"})) == "before"
            before = (await status_after(status, 1))["tasks"]
            most, called = 0, False
            # Its caller reads nothing until the upstream has answered (then the gateway has
            # read every line): the lines passed on to it wait in the gateway meanwhile. No other
            # call is made on the noisy upstream: a line is passed on only with one caller.
            async with http.stream("POST", url, json=call, headers=headers) as answer:
                while (now := await status())["pending_calls"] or not called:
                    called = called or now["pending_calls"] > 0
                    most = max(most, now["tasks"] - before)
                    await anyio.sleep(0.05)
                most = max(most, now["tasks"] - before)
                body = await answer.aread()
            assert b'"text":"flood"' in body.replace(b" ", b"")
            assert b"notifications/message" in body  # its caller got lines
            assert text_of(await bystander.call_tool("calm__echo", {"text": "after"})) == "after"
    assert most < PASSING + SPARE_TASKS, most


async def test_a_line_no_call_owns_reaches_its_listeners_cut_to_a_bounded_size(tmp_path: Path) -> None:
    # Whole, each client's queue of such lines held 16 of 4 MB each: 20 listeners that did not
    # read took the gateway from 170 to 581 MB, which it kept.
    heard: list[str] = []
    async with (
        noisy_gateway(tmp_path) as (url, _),
        Client(url, mode="legacy", logging_callback=hearing(heard)) as reader,
    ):
        assert text_of(await reader.call_tool("noisy__flood", {"lines": 2, "size": 500_000})) == "flood"
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await reader.set_logging_level("debug")  # the flood follows its answer: nobody's lines
        with anyio.fail_after(BOUND):
            while len(heard) < 2:
                await anyio.sleep(0.01)
    assert [len(line) <= MAX_DATA + 30 for line in heard] == [True, True]
    assert all(
        line.startswith(f"{n} ") and line.endswith("… (500000 characters)") for n, line in enumerate(heard)
    )
