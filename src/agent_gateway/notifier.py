"""Telling connected clients that the catalog changed, in both protocol eras.

Handshake-era sessions get ``notifications/*/list_changed`` on their connection; modern
(2026-07-28) clients get the same events on their ``subscriptions/listen`` streams.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import anyio
import mcp_types as types
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_gateway.catalog import Kind

logger = logging.getLogger(__name__)

_SEND_TIMEOUT = 2.0
_EVENTS: dict[Kind, ServerEvent] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


class ListChangedNotifier(Middleware):
    """Remembers live handshake-era sessions and fans catalog changes out to every client."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakSet[ServerSession] = weakref.WeakSet()
        self.bus = InMemorySubscriptionBus()
        self.listen_handler = ListenHandler(self.bus)

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        ctx = context.fastmcp_context
        request = ctx.request_context if ctx is not None else None
        if request is not None and request.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._sessions.add(request.session)
        return await call_next(context)

    async def notify(self, kinds: frozenset[Kind]) -> None:
        """Send one list_changed per changed kind to every session, and publish to listeners."""
        for kind in sorted(kinds):
            await self.bus.publish(_EVENTS[kind])
        for session in list(self._sessions):
            await self._notify_session(session, kinds)

    async def _notify_session(self, session: ServerSession, kinds: frozenset[Kind]) -> None:
        with anyio.move_on_after(_SEND_TIMEOUT):
            try:
                for kind in sorted(kinds):
                    await session.send_notification(_notification(kind))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._sessions.discard(session)


def _notification(kind: Kind) -> types.ServerNotification:
    if kind == "tools":
        return types.ToolListChangedNotification()
    if kind == "prompts":
        return types.PromptListChangedNotification()
    return types.ResourceListChangedNotification()
