"""One client's ``logging/setLevel`` requests took the upstream's call slots: each was sent
on to every shared handshake-era upstream session while the level last sent differed, and the
level was recorded only once the upstream had answered, so concurrent setLevel requests (one
level) each sent one, every one inside the upstream's ``max_concurrency`` (200) guard, none
under the client's own limits. With an upstream slow to answer them, a bystander's tool call
was refused ``the limit (max_concurrency) is 200``. Found by a helper's attack (stop 50).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp_types as types
from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, bearer, client
from tests.support import RunningGateway, running_gateway, serving_upstream

BOUND = 60.0  # a bound against a hang, not a timing: the flood takes 6 s alone on a slow host
ATTACK = 260
VERSION = "2025-11-25"


class _SlowLevels(Middleware):
    """An upstream slow to apply a log level (a remote one, say)."""

    def __init__(self, seen: list[str], release: anyio.Event, hold: float = 4.0) -> None:
        self._seen = seen
        self._release = release
        self._hold = hold
        self.in_flight = self.most = 0
        """setLevel requests being answered now, and the most at once."""

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method == "logging/setLevel":
            self._seen.append("setLevel")
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                with anyio.move_on_after(self._hold):  # within the gateway's own 5 s bound on it
                    await self._release.wait()
            finally:
                self.in_flight -= 1
        return await call_next(context)


def _server(seen: list[str], release: anyio.Event, levels: Middleware | None = None) -> FastMCP:
    server = FastMCP("echo", middleware=[levels or _SlowLevels(seen, release)])

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


Attack = tuple[RunningGateway, Client, httpx.AsyncClient, dict[str, str]]
"""A gateway, a bystander, the attacker's HTTP client and its session's headers."""


@asynccontextmanager
async def attacked(upstream: str, tool: str) -> AsyncIterator[Attack]:
    """A gateway (bearer auth) before ``upstream``, a bystander that called its ``tool`` once,
    and the attacker's HTTP client with its handshake-era session's headers."""
    config = {"upstreams": {"u": {"url": upstream, "protocol": "legacy"}}} | bearer({})
    limits = httpx.Limits(max_connections=ATTACK + 10, max_keepalive_connections=ATTACK + 10)
    async with (
        running_gateway(config, environ={"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}) as gw,
        client(gw.url, BYSTANDER_TOKEN) as bystander,
        httpx.AsyncClient(timeout=BOUND, limits=limits) as http,
    ):
        assert not (await bystander.call_tool(tool, {"text": "before"})).is_error
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {ATTACKER_TOKEN}",
        }
        info = {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": {"name": "attacker", "version": "0"},
        }
        init = await http.post(
            gw.url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": info}
        )
        headers |= {"Mcp-Session-Id": init.headers["mcp-session-id"], "MCP-Protocol-Version": VERSION}
        await http.post(
            gw.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        yield gw, bystander, http, headers


async def test_one_clients_set_level_requests_do_not_take_a_bystanders_upstream_slots() -> None:
    seen: list[str] = []
    release = anyio.Event()
    async with (
        serving_upstream(_server(seen, release)) as url,
        attacked(url, "u__echo") as (
            gw,
            bystander,
            http,
            headers,
        ),
    ):
        already = len(seen)

        async def set_level(n: int) -> None:
            body = {
                "jsonrpc": "2.0",
                "id": n + 1,
                "method": "logging/setLevel",
                "params": {"level": "debug"},
            }
            await http.post(gw.url, headers=headers, json=body)

        result: types.CallToolResult | None = None
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                for n in range(ATTACK):
                    tg.start_soon(set_level, n)
                while len(seen) == already:
                    await anyio.sleep(0.02)
                # The upstream holds the attacker's setLevel requests; the bystander calls.
                result = await bystander.call_tool("u__echo", {"text": "during"})
                release.set()
    assert result is not None
    text = result.content[0].text if isinstance(result.content[0], types.TextContent) else ""
    assert not result.is_error, f"the bystander was refused while one client flooded setLevel: {text}"
    assert len(seen) - already <= 2, (
        f"one client's {ATTACK} setLevel requests sent {len(seen) - already} upstream"
    )


async def test_one_clients_set_level_requests_of_changing_levels_are_sent_upstream_one_at_a_time() -> None:
    # Each of these changes the level the shared session should run at, so each is sent on:
    # one at a time (the session's own lock), in the order asked, never a slot each.
    seen: list[str] = []
    release = anyio.Event()
    # Each held 1 s at most: a send the gateway gives up on (5 s, its wait for the lock
    # counted) while the upstream still holds it would let the next one in beside it.
    levels = _SlowLevels(seen, release, hold=1.0)
    async with (
        serving_upstream(_server(seen, release, levels)) as url,
        attacked(url, "u__echo") as attack,
    ):
        result = await _changing_levels(32, attack, seen, release)
    assert not result.is_error, result
    assert levels.most == 1, f"{levels.most} setLevel requests were sent upstream at once"


async def _set_level(attack: Attack, n: int) -> None:
    """The attacker's ``n``-th setLevel: info or error, changing at each."""
    gw, _, http, headers = attack
    level = "info" if n % 2 else "error"
    body = {"jsonrpc": "2.0", "id": n + 1, "method": "logging/setLevel", "params": {"level": level}}
    await http.post(gw.url, headers=headers, json=body)


async def _changing_levels(
    count: int, attack: Attack, seen: list[str], release: anyio.Event
) -> types.CallToolResult:
    """``count`` setLevel requests of changing levels at once; once the upstream holds the
    first, the bystander's call (its result), then the upstream let go."""
    result: types.CallToolResult | None = None
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            for n in range(count):
                tg.start_soon(_set_level, attack, n)
            while len(seen) < 1:
                await anyio.sleep(0.02)
            result = await attack[1].call_tool("u__echo", {"text": "during"})
            release.set()
    assert result is not None
    return result


class _Unimplemented(Middleware):
    """Answers ``logging/setLevel`` Method not found, the first once ``release`` is set (1 s
    at most), though the server declares logging (an upstream that never wrote the handler)."""

    def __init__(self, seen: list[str], release: anyio.Event) -> None:
        self._seen, self._release = seen, release

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method != "logging/setLevel":
            return await call_next(context)
        self._seen.append("setLevel")
        with anyio.move_on_after(1.0):  # within the gateway's own 5 s bound on it
            await self._release.wait()
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found")


async def test_set_level_requests_queued_behind_one_answered_method_not_found_are_not_sent() -> None:
    # Before, each waited its turn having checked, before the wait, that the upstream had not
    # yet answered Method not found: all queued behind the first answer went out once each.
    seen: list[str] = []
    release = anyio.Event()
    async with (
        serving_upstream(_server(seen, release, _Unimplemented(seen, release))) as url,
        attacked(url, "u__echo") as attack,
    ):
        assert not (await _changing_levels(8, attack, seen, release)).is_error
        await _set_level(attack, 8)  # and none after
    assert seen == ["setLevel"], f"{len(seen)} setLevel requests sent to an upstream without it"
