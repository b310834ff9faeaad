"""Heavy load on one upstream (issue 16, finding 3): calls past a client's bound or the
upstream's bound are refused at once with a clear error, health checks keep their own lane,
and the upstream is never marked down for being busy."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.config import UpstreamConfig
from agent_gateway.upstreams import queueing
from agent_gateway.upstreams.transports import PROBE_LANE, pool_size
from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, bearer, client
from tests.support import RunningGateway, running_gateway, serving


def _slow_server(release: anyio.Event) -> FastMCP:
    server = FastMCP("slow")

    @server.tool
    async def wait() -> str:
        await release.wait()
        return "released"

    @server.tool
    def echo(text: str) -> str:
        return text

    @server.prompt
    async def brief(topic: str) -> str:  # a render that fetches something remote, say
        await release.wait()
        return f"brief on {topic}"

    @server.resource("slow://report")
    async def report() -> str:
        await release.wait()
        return "report"

    return server


@pytest.fixture(autouse=True)
def _turns_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count slots, not turns: the slow upstream serves in the gateway's own
    process, so on a loaded machine its pings came back late, the window narrowed, and the
    calls it held back waited for a turn instead of meeting the bounds under test (a CI run:
    the busy-upstream test's wait for the attacker's 8 calls in flight, or the bystander's
    refusals, timed out). A ping must be a second late to narrow it here, as in
    ``test_upstream_share.py``."""
    monkeypatch.setattr(queueing, "TARGET", 1.0)


def _counting_pings(app: ASGIApp, pings: list[None]) -> ASGIApp:
    """``app``, appending to ``pings`` as each ``ping`` request's body arrives."""

    async def counting(scope: Scope, receive: Receive, send: Send) -> None:
        async def received() -> Message:
            message = await receive()
            if _PING.search(message.get("body", b"")):
                pings.append(None)
            return message

        await app(scope, received if scope["type"] == "http" else receive, send)

    return counting


_PING = re.compile(rb'"method"\s*:\s*"ping"')


@asynccontextmanager
async def _attacked(
    release: anyio.Event, upstream: dict[str, Any], max_concurrency: int, pings: list[None] | None = None
) -> AsyncIterator[tuple[RunningGateway, Client, Client]]:
    """The slow upstream behind a gateway; the attacker's calls in flight bounded by its policy.
    ``pings``: a record of the pings the upstream is sent."""
    app = _slow_server(release).http_app(path="/mcp")
    async with serving(_counting_pings(app, [] if pings is None else pings)) as base:
        url = f"{base}/mcp"
        config = {"upstreams": {"slow": {"url": url} | upstream}} | bearer(
            {"max_concurrency": max_concurrency}
        )
        environ = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
        async with (
            running_gateway(config, environ=environ) as gw,
            client(gw.url, ATTACKER_TOKEN) as attacker,
            client(gw.url, BYSTANDER_TOKEN) as bystander,
        ):
            yield gw, attacker, bystander


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def test_the_connection_pool_keeps_a_lane_that_calls_never_fill() -> None:
    assert pool_size(UpstreamConfig(url="http://x/mcp")) == 200 + PROBE_LANE
    assert pool_size(UpstreamConfig(url="http://x/mcp", max_concurrency=10)) == 10 + PROBE_LANE


async def test_a_busy_upstream_refuses_past_its_bounds_and_stays_up() -> None:
    release = anyio.Event()
    # The handshake era: its calls and its health checks share the SDK's connections, so only
    # the probe lane keeps a check from waiting behind the 10 calls. (A modern-era call goes
    # out on the forwarder's own connections, and the checks would pass with no lane at all.)
    # Each client's share is every slot here: the bounds are under test (the share, by default
    # as many as a client leaves free, in test_upstream_share.py).
    upstream = {
        "max_concurrency": 10,
        "max_concurrency_per_client": 10,
        "protocol": "legacy",
        "health": {"interval": 0.2, "timeout": 5},
    }
    pings: list[None] = []
    async with _attacked(release, upstream, 8, pings) as (gw, attacker, bystander):
        guard = gw.gateway.pool.get("slow").guard
        theirs: list[types.CallToolResult] = []
        ours: list[types.CallToolResult] = []

        async def call(c: Client, into: list[types.CallToolResult]) -> None:
            into.append(await c.call_tool("slow__wait", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(call, attacker, theirs)
            with anyio.fail_after(20):
                while len(theirs) < 22 or guard.in_flight < 8:
                    await anyio.sleep(0.02)
            # The attacker holds 8 of the upstream's 10; the bystander gets the other 2.
            for _ in range(5):
                tg.start_soon(call, bystander, ours)
            with anyio.fail_after(20):
                while len(ours) < 3 or guard.in_flight < 10:
                    await anyio.sleep(0.02)
            # Pings reach the upstream while every call slot is taken: health checks (every
            # 0.2 s) and the window's (every 0.1 s while busy). With no lane, none did, and the
            # first health check sent then marked the upstream down as it timed out.
            seen = len(pings)
            with anyio.fail_after(20):
                while len(pings) < seen + 3:
                    await anyio.sleep(0.02)
            status = {s.name: s for s in gw.gateway.pool.statuses()}["slow"]
            assert status.serving
            assert status.connections == 1  # never lost, never reconnected
            release.set()
    refused_theirs = [_text(r) for r in theirs if r.is_error]
    assert (
        refused_theirs == ["client limit: 8 calls already in flight, the limit (max_concurrency) is 8"] * 22
    )
    refused_ours = [_text(r) for r in ours if r.is_error]
    assert len(refused_ours) == 3
    assert all("the limit (max_concurrency) is 10" in t for t in refused_ours)
    assert [_text(r) for r in theirs + ours if not r.is_error] == ["released"] * 10


async def test_a_clients_slow_prompt_renders_and_resource_reads_take_only_its_own_slots() -> None:
    """Prompt renders and resource reads hold an upstream's slot as long as a tool call: they
    count against the client's ``max_concurrency`` as calls do, or one client's slow renders
    would take every slot of the upstream and the bystander's calls be refused."""
    release = anyio.Event()
    async with _attacked(release, {"max_concurrency": 10}, 4) as (gw, attacker, bystander):
        guard = gw.gateway.pool.get("slow").guard
        refusals: list[str] = []

        async def render() -> None:
            try:
                await attacker.get_prompt("slow__brief", {"topic": "x"})
            except MCPError as exc:
                refusals.append(exc.error.message)

        async def read() -> None:
            try:
                await attacker.read_resource("slow://report")
            except MCPError as exc:
                refusals.append(exc.error.message)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(render)
                tg.start_soon(read)
            with anyio.fail_after(20):  # each of the 12 in flight upstream or refused
                while len(refusals) + guard.in_flight < 12:
                    await anyio.sleep(0.02)
            assert _text(await bystander.call_tool("slow__echo", {"text": "hi"})) == "hi"
            assert guard.in_flight == 4
            release.set()
        assert refusals == ["client limit: 4 calls already in flight, the limit (max_concurrency) is 4"] * 8
