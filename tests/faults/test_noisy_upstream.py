"""An upstream that sends malformed notifications by the hundred costs the log one line per
kind every ten seconds, not a traceback each: the upstream chooses how many it sends."""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.compat.mcp import CLIENT_SESSION_LOGGER
from agent_gateway.logs import PeerRepeats
from agent_gateway.upstreams.connection import REFRESH_SHARE, REFRESH_SPACING
from agent_gateway.upstreams.http_client import MAX_COOKIES
from tests.faults.harness import text_of
from tests.support import (
    SERVERS,
    child_process,
    free_port,
    gateway_env,
    intercepted,
    ready,
    running_gateway,
    serving,
)

NOISE = 300
"""Malformed progress notifications sent before one call's result."""


def noisy_upstream() -> ASGIApp:
    """A FastMCP upstream whose ``noisy`` call is answered with ``NOISE`` malformed progress
    notifications (``progress`` a string), then its result, on one SSE stream."""
    server = FastMCP("noisy")
    server.tool(lambda: "quiet", name="noisy")
    return intercepted(server, _noisy)


async def _noisy(scope: Scope, request: dict[str, Any], send: Send) -> bool:
    if (request.get("params") or {}).get("name") != "noisy":
        return False
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    bad = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": "lots"},
    }
    frame = f"event: message\ndata: {json.dumps(bad)}\n\n".encode()
    await send({"type": "http.response.body", "body": frame * NOISE, "more_body": True})
    result = {"content": [{"type": "text", "text": "done"}]}
    answer = {"jsonrpc": "2.0", "id": request["id"], "result": result}
    await send(
        {"type": "http.response.body", "body": f"event: message\ndata: {json.dumps(answer)}\n\n".encode()}
    )
    return True


async def test_an_upstreams_malformed_notifications_by_the_hundred_write_one_line(tmp_path: Path) -> None:
    # One gateway process over the noisy upstream in both eras (each was a case of its own, a
    # gateway process each): a handshake-era upstream's notifications are read by the SDK, a
    # modern one's by the forwarder.
    port = free_port()
    log = tmp_path / "gateway.log"
    protocols = ("legacy", "auto")
    async with serving(noisy_upstream()) as base:
        upstreams = {protocol: {"url": f"{base}/mcp", "protocol": protocol} for protocol in protocols}
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"server": {"port": port}, "upstreams": upstreams}))
        command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(config)]
        async with child_process(command, gateway_env(), log):
            await ready(port)
            async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
                answers = [
                    text_of(await client.call_tool(f"{p}__noisy", {})) for p in protocols for _ in range(2)
                ]
    assert answers == ["done"] * 4  # each call is served: only the notifications are dropped
    lines = log.read_text().splitlines()
    noisy = [line for line in lines if "notification" in line and "WARNING" in line]
    # One line for all 600 of each (the SDK's for the handshake-era upstream, the forwarder's
    # for the modern one), naming what was wrong, and no traceback.
    assert len(noisy) == 2, noisy
    assert len({line.split()[3] for line in noisy}) == 2, noisy  # one line by each reader
    assert all("progress" in line for line in noisy), noisy
    assert not any(line.startswith("Traceback") for line in lines)


def _warning(name: str, msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.makeLogRecord({"name": name, "levelno": level, "msg": msg, "args": args})


def test_warnings_quoting_what_an_upstream_sent_are_one_kind_and_other_lines_pass() -> None:
    repeats = PeerRepeats()
    # The SDK writes some with f-strings quoting the upstream's words: each text different.
    quoted = [
        repeats.filter(_warning("mcp.client.streamable_http", f"Unknown SSE event: {n}")) for n in range(50)
    ]
    assert quoted.count(True) == 1
    # The gateway's own lines about what an upstream sent: a question outside any call, a
    # listing's repeated names (each of 500 questions refused wrote a line).
    for name in (
        "agent_gateway.upstreams.replies",
        "agent_gateway.catalog",
        "opentelemetry.trace.propagation.tracecontext",
    ):
        refusals = [repeats.filter(_warning(name, "%s from %s refused: %s", "m", "up", n)) for n in range(50)]
        assert refusals.count(True) == 1, name
    # The gateway's own warnings, and the SDK client's below WARNING, are not the upstream's.
    assert all(repeats.filter(_warning("agent_gateway.proxy", "same")) for _ in range(5))
    assert all(repeats.filter(_warning(CLIENT_SESSION_LOGGER, "same", level=logging.INFO)) for _ in range(5))
    # A record it cannot format is written as it is, not lost, and raises nothing.
    assert repeats.filter(_warning(CLIENT_SESSION_LOGGER, "%d notifications", "many"))


async def test_a_stdio_upstreams_garbage_and_stray_answers_by_the_hundred_write_one_line_each(
    tmp_path: Path,
) -> None:
    """Lines that are not JSON-RPC and answers to ids never sent, 200 of each from each of two
    upstreams: the calls are served, and each kind of warning is written once per upstream,
    naming it (each line wrote one before; then the first upstream's hid the second's, and
    the lines about garbage named no upstream)."""
    port = free_port()
    log = tmp_path / "gateway.log"
    config = tmp_path / "gateway.yaml"
    upstream = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}
    upstreams = {"noisy": upstream, "loud": upstream}
    config.write_text(yaml.safe_dump({"server": {"port": port}, "upstreams": upstreams}))
    command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(config)]
    async with child_process(command, gateway_env(), log):
        await ready(port)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            answers = [
                text_of(await client.call_tool(f"{name}__garble", {"times": 100}))
                for name in ("noisy", "loud", "noisy", "loud")
            ]
    assert answers == ["garble"] * 4
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    for kind in ("not JSON-RPC", "id never sent"):
        lines = [line for line in warnings if kind in line]
        assert len(lines) == 2, lines
        assert {_named(line) for line in lines} == {"noisy", "loud"}, lines


def _named(line: str) -> str | None:
    """The upstream a warning names by its session (``upstream session NAME/1a2b3c4d``)."""
    found = re.search(r"upstream session (\w+)/[0-9a-f]{8}", line)
    return found.group(1) if found else None


async def test_an_upstream_saying_its_list_changed_after_each_listing_is_listed_once_a_second() -> None:
    """Listed again after each notice as fast as each listing ended, such an upstream had the
    gateway list it (and tell every client) without pause; each change still arrives."""
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}
    async with (
        running_gateway({"upstreams": {"noisy": noisy}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        assert text_of(await client.call_tool("noisy__churn", {"times": 4})) == "churn"
        with anyio.fail_after(20):
            while "noisy__churned_3" not in {tool.name for tool in (await client.list_tools()).tools}:
                await anyio.sleep(0.05)
        listed = json.loads(text_of(await client.call_tool("noisy__listings", {})))
    # At start-up, then once for each of the four notices, each a second or more after the last.
    assert len(listed) == 5, listed
    gaps = [later - earlier for earlier, later in itertools.pairwise(listed[1:])]
    assert min(gaps) >= REFRESH_SPACING * 0.9, gaps


async def test_an_upstream_whose_listings_take_long_is_listed_a_tenth_of_the_time_at_most() -> None:
    """Spaced a second apart whatever each took, an upstream of 10,000 tools saying it changed
    after each listing took the gateway's event loop 40 % of the time (0.7-1.6 s a listing)."""
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}
    async with (
        running_gateway({"upstreams": {"noisy": noisy}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        assert text_of(await client.call_tool("noisy__churn", {"times": 2, "slow": 0.4})) == "churn"
        with anyio.fail_after(30):
            while "noisy__churned_1" not in {tool.name for tool in (await client.list_tools()).tools}:
                await anyio.sleep(0.05)
        listed = json.loads(text_of(await client.call_tool("noisy__listings", {})))
    # Each listing after the churn took 0.4 s or more: the next one waited nine times that.
    assert len(listed) == 3, listed
    assert listed[2] - listed[1] >= 0.4 / REFRESH_SHARE - 0.4 * 1.1, listed


def cookie_setting(server: FastMCP, seen: list[int]) -> ASGIApp:
    """``server`` over Streamable HTTP, each answer setting 100 cookies never set before, and
    the number of cookies each request carried recorded in ``seen``."""
    app = server.http_app(path="/mcp")
    names = itertools.count()

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        cookie = dict(scope["headers"]).get(b"cookie", b"")
        seen.append(len(cookie.split(b";")) if cookie else 0)

        async def setting(message: Message) -> None:
            if message["type"] == "http.response.start":
                cookies = [(b"set-cookie", b"c%d=%s; Path=/" % (next(names), b"v" * 400)) for _ in range(100)]
                message = {**message, "headers": [*message["headers"], *cookies]}
            await send(message)

        return await app(scope, receive, setting)

    return upstream


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_an_upstream_setting_cookies_without_end_is_sent_back_at_most_fifty(protocol: str) -> None:
    # Every cookie an upstream set was kept and sent with every request, the jar walked each
    # time: 100 new ones an answer took 0.85 of a core within 25 s.
    server = FastMCP("baker")
    server.tool(lambda: "baked", name="bake")
    seen: list[int] = []
    async with (
        serving(cookie_setting(server, seen)) as base,
        running_gateway({"upstreams": {"baker": {"url": f"{base}/mcp", "protocol": protocol}}}) as gw,
        Client(gw.url) as client,
    ):
        answers = [text_of(await client.call_tool("baker__bake", {})) for _ in range(10)]
    assert answers == ["baked"] * 10
    assert 0 < max(seen) <= MAX_COOKIES, seen
