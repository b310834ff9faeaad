"""A client's dedicated upstream session (``session: per_client``) across replicas (issue
19): a handshake-era Streamable HTTP upstream's own session is resumed by whichever replica
serves the client, not opened anew, so what the upstream keeps in it is kept; it ends when
the client's session ends, and not when one replica lets it go."""

from __future__ import annotations

import json
import re
import signal
import warnings
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
from fastmcp import Context, FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import Redis
from tests.replicas.test_sessions import BOUND, session_to, text_of
from tests.support import serving_upstream


class Handshakes(Middleware):
    """The upstream session of each ``initialize`` request an upstream is sent."""

    def __init__(self) -> None:
        self.sessions: list[str] = []

    async def on_initialize(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        answer = await call_next(context)
        assert context.fastmcp_context is not None
        self.sessions.append(context.fastmcp_context.session_id)
        return answer


def visits_server(handshakes: Handshakes | None = None, heard: anyio.Event | None = None) -> FastMCP:
    """Counts each upstream session's visits: its state lives in that session only. With
    ``heard``, its ``tell`` sends a log line every 0.2 s on the session's notification stream
    (related to no request) until ``heard`` is set, for 8 s at most, then answers."""
    server = FastMCP("visits")
    counts: dict[str, int] = {}
    if handshakes is not None:
        server.add_middleware(handshakes)

    if heard is not None:
        told = heard

        @server.tool
        async def tell(ctx: Context) -> str:
            with anyio.move_on_after(8):
                while not told.is_set():
                    with warnings.catch_warnings(category=MCPDeprecationWarning, action="ignore"):
                        await ctx.session.send_log_message("info", "told later", logger="visits")
                    await anyio.sleep(0.2)
            return ctx.session_id

    @server.tool
    def visit(ctx: Context) -> str:
        session = ctx.session_id
        counts[session] = counts.get(session, 0) + 1
        return f"{session} {counts[session]}"

    return server


async def known_upstream(url: str, session: str) -> bool:
    """Whether the upstream still holds ``session`` (a request under its id is not a 404)."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": session,
        "Mcp-Protocol-Version": "2025-11-25",
    }
    async with httpx.AsyncClient(timeout=BOUND) as http:
        return (await http.post(url, json=ping, headers=headers)).status_code != 404


async def call_at(url: str, session: str, tool: str) -> str:
    """The text of ``tool``'s answer, called (raw requests) in client session ``session`` at ``url``."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": session,
        "Mcp-Protocol-Version": "2025-11-25",
    }
    async with httpx.AsyncClient(timeout=BOUND) as http:
        answer = await http.post(url, json=call, headers=headers)
    assert answer.status_code == 200, answer.text
    body = answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        body = next(line[5:] for line in body.splitlines() if line.startswith("data:") and '"result"' in line)
    text: str = json.loads(body)["result"]["content"][0]["text"]
    return text


async def stop(cluster: Cluster, replica: int) -> None:
    """SIGTERM ``replica`` and wait until it has exited (cleanly)."""
    cluster.processes[replica].send_signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(cluster.processes[replica].wait, BOUND) == 0


def dedicated(upstream: str, redis: Redis, prefix: str) -> dict[str, Any]:
    return {
        "store": {"url": redis.url, "prefix": prefix},
        "upstreams": {"visits": {"url": upstream, "protocol": "legacy", "session": "per_client"}},
        "agent": {"enabled": False},
    }


async def test_a_dedicated_upstream_session_is_resumed_by_the_other_replica_and_ends_with_the_client(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    handshakes = Handshakes()
    async with (
        serving_upstream(visits_server(handshakes)) as upstream,
        replicas(dedicated(upstream, redis, prefix), tmp_path) as cluster,
    ):
        async with session_to(cluster.url) as (client, _):
            seen = [text_of(await client.call_tool("visits__visit", {})) for _ in range(6)]
            served = [(await cluster.status(i))["calls"] for i in range(2)]
        sessions = {text.split()[0] for text in seen}
        [session] = sessions  # one upstream session, whichever replica served the call
        # Ended upstream with the client's session (the client's DELETE), by a replica.
        with anyio.fail_after(BOUND):
            while await known_upstream(upstream, session):
                await anyio.sleep(0.05)
        logs = cluster.log(0) + cluster.log(1)
    assert min(served) >= 2  # both replicas served the client, in turn
    # The resume's check that the upstream still knows the session warns of nothing.
    assert "resumed" in logs
    assert re.search(r"\w+Warning: ", logs) is None  # a Python warning's line (warnings.warn)
    assert [int(text.split()[1]) for text in seen] == [1, 2, 3, 4, 5, 6]
    # Opened once: the replica resuming it adopts the recorded handshake, sending none.
    assert handshakes.sessions.count(session) == 1, handshakes.sessions


async def test_a_replica_stopping_leaves_the_dedicated_upstream_session_open_for_the_other(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        serving_upstream(visits_server()) as upstream,
        replicas(dedicated(upstream, redis, prefix), tmp_path) as cluster,
        session_to(cluster.endpoint(1)) as (client, session),
    ):
        await client.list_tools()
        assert session.id is not None
        first = await call_at(cluster.endpoint(0), session.id, "visits__visit")
        # Replica 0 lets its upstream session go; the client's session lives on: kept.
        await stop(cluster, 0)
        second = text_of(await client.call_tool("visits__visit", {}))
    opened, _ = first.split()
    assert [first, second] == [f"{opened} 1", f"{opened} 2"]  # resumed by replica 1, not opened anew


async def test_a_resumed_dedicated_upstream_session_passes_on_what_the_upstream_sends_outside_calls(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    heard = anyio.Event()
    lines: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(str(params.data))
        heard.set()

    async with (
        serving_upstream(visits_server(heard=heard)) as upstream,
        replicas(dedicated(upstream, redis, prefix), tmp_path) as cluster,
        session_to(cluster.endpoint(1), logging_callback=on_log) as (client, session),
    ):
        await client.list_tools()
        assert session.id is not None
        opened = (await call_at(cluster.endpoint(0), session.id, "visits__visit")).split()[0]
        await stop(cluster, 0)  # its notification stream upstream closes with it
        # Resumed on replica 1, which opens the session's notification stream at once: the
        # lines the upstream sends on it while the call runs reach the client.
        assert text_of(await client.call_tool("visits__tell", {})) == opened
    assert heard.is_set()
    assert lines[0] == "told later"
