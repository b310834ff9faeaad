"""Telling connected clients that the catalog changed, in both protocol eras.

Handshake-era sessions get ``notifications/*/list_changed`` on their connection; modern
(2026-07-28) clients get the same events on their ``subscriptions/listen`` streams.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import anyio
from mcp.server.connection import Connection
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ServerEvent,
    ToolsListChanged,
)

from agent_gateway.catalog import Kind

logger = logging.getLogger(__name__)

_SEND_TIMEOUT = 2.0
_EVENTS: dict[Kind, ServerEvent] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


class ListChangedNotifier:
    """Fans catalog changes out to every client, in both eras."""

    def __init__(self, connections: Callable[[], Iterable[Connection]]) -> None:
        self._connections = connections
        self.bus = InMemorySubscriptionBus()
        """Catalog changes for modern clients' listen streams (served by ResourceSubscriptions)."""

    async def notify(self, kinds: frozenset[Kind]) -> None:
        """Send one list_changed per changed kind to every session, and publish to listeners."""
        for kind in sorted(kinds):
            await self.bus.publish(_EVENTS[kind])
        for connection in list(self._connections()):
            # Connection.notify is best-effort and never raises; the bound guards a stuck peer.
            with anyio.move_on_after(_SEND_TIMEOUT):
                for kind in sorted(kinds):
                    await _SENDERS[kind](connection)


_SENDERS: dict[Kind, Callable[[Connection], Awaitable[None]]] = {
    "tools": lambda c: c.send_tool_list_changed(),
    "prompts": lambda c: c.send_prompt_list_changed(),
    "resources": lambda c: c.send_resource_list_changed(),
}
