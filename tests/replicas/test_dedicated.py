"""A client's dedicated upstream session (``session: per_client``) across replicas (issue
19): a handshake-era Streamable HTTP upstream's own session is resumed by whichever replica
serves the client, not opened anew, so what the upstream keeps in it is kept; it ends when
the client's session ends, and not when one replica lets it go."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
from fastmcp import Context, FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from tests.replicas.cluster import replicas
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


def visits_server(handshakes: Handshakes | None = None) -> FastMCP:
    """Counts each upstream session's visits: its state lives in that session only."""
    server = FastMCP("visits")
    counts: dict[str, int] = {}
    if handshakes is not None:
        server.add_middleware(handshakes)

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


async def test_a_dedicated_upstream_session_is_resumed_by_the_other_replica_and_ends_with_the_client(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    handshakes = Handshakes()
    async with serving_upstream(visits_server(handshakes)) as upstream:
        data = {
            "store": {"url": redis.url, "prefix": prefix},
            "upstreams": {"visits": {"url": upstream, "protocol": "legacy", "session": "per_client"}},
            "agent": {"enabled": False},
        }
        async with replicas(data, tmp_path) as cluster:
            async with session_to(cluster.url) as (client, _):
                seen = [text_of(await client.call_tool("visits__visit", {})) for _ in range(6)]
                served = [(await cluster.status(i))["calls"] for i in range(2)]
            sessions = {text.split()[0] for text in seen}
            [session] = sessions  # one upstream session, whichever replica served the call
            # Ended upstream with the client's session (the client's DELETE), by a replica.
            with anyio.fail_after(BOUND):
                while await known_upstream(upstream, session):
                    await anyio.sleep(0.05)
    assert min(served) >= 2  # both replicas served the client, in turn
    assert [int(text.split()[1]) for text in seen] == [1, 2, 3, 4, 5, 6]
    # Opened once: the replica resuming it adopts the recorded handshake, sending none.
    assert handshakes.sessions.count(session) == 1, handshakes.sessions
