"""An upstream that never answers ``logging/setLevel`` costs no other client a wait. A
handshake-era client coming or going changes the level a shared upstream session runs at,
and that change was sent upstream in the client's own first request (and its end): with one
upstream holding its answer, a bystander's first call to another upstream waited the
gateway's 5 s bound on it (5.16 s to connect and call once, 0.06 s without that upstream),
and again at every client's arrival. Now the change is sent by a task of the gateway's own,
changes made meanwhile sent together once it is done (``downstream/level_changes.py``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.support import running_gateway, serving_upstream

BOUND = 30.0  # against a hang, not a timing


class _HeldLevels(Middleware):
    """Answers its first ``logging/setLevel`` at once, and holds every later one until
    ``release`` is set (a remote upstream that stopped answering them, say)."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.seen = self.holding = 0

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method == "logging/setLevel":
            self.seen += 1
            if self.seen > 1:
                self.holding += 1
                try:
                    await self.release.wait()
                finally:
                    self.holding -= 1
        return await call_next(context)


def _servers(held: _HeldLevels) -> tuple[FastMCP, FastMCP]:
    hostile, healthy = FastMCP("hostile", middleware=[held]), FastMCP("healthy")

    @hostile.tool
    def idle() -> str:
        return "idle"

    @healthy.tool
    def echo(text: str) -> str:
        return text

    return hostile, healthy


async def test_a_client_arriving_is_served_while_an_upstream_holds_the_level_its_arrival_changed() -> None:
    held = _HeldLevels()
    hostile, healthy = _servers(held)
    async with (
        serving_upstream(hostile) as hostile_url,
        serving_upstream(healthy) as healthy_url,
        running_gateway(
            {"upstreams": {"h": {"url": hostile_url, "protocol": "legacy"}, "ok": {"url": healthy_url}}}
        ) as gw,
        Client(gw.url, mode="legacy") as quiet,
    ):
        with pytest.warns(MCPDeprecationWarning):
            await quiet.set_logging_level("error")  # answered upstream: every upstream at error
        with anyio.fail_after(BOUND):
            async with Client(gw.url, mode="legacy") as bystander:  # asks no level: debug upstream
                answer = await bystander.call_tool("ok__echo", {"text": "served"})
                # Before, its first request waited for the hostile upstream's answer until the
                # gateway gave that up (and cancelled it upstream).
                assert held.holding == 1, "the bystander's call waited for the hostile upstream"
            assert not answer.is_error
            held.release.set()
            while held.holding:
                await anyio.sleep(0.01)
