"""Resource subscriptions routed between subscribing clients and the upstream owning the resource.

A client subscribes to a public URI; the gateway subscribes once upstream per upstream
session and URI, however many clients share it, and unsubscribes when the last one leaves
(or its session ends). Each ``notifications/resources/updated`` from an upstream session
goes to exactly the clients subscribed through that session, under the URI they used.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from agent_gateway import sessions
from agent_gateway.errors import GatewayError, to_error_data
from agent_gateway.proxy import Proxy
from agent_gateway.sessions import DownstreamSession
from agent_gateway.upstreams.session import UpstreamSession

logger = logging.getLogger(__name__)

_SEND_TIMEOUT = 5.0

Key = tuple[str, str]
"""(upstream session id, upstream URI)"""


class ResourceSubscriptions:
    """Who is subscribed to what, through which upstream session."""

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy
        self._subscribers: dict[Key, dict[DownstreamSession, str]] = defaultdict(dict)
        self._upstream: dict[Key, UpstreamSession] = {}

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """The ``resources/subscribe`` handler (handshake-era clients)."""
        session = _session(ctx)
        try:
            upstream, uri = await self._proxy.resource_session(params.uri, session)
            key = (upstream.id, uri)
            if key not in self._upstream:
                await upstream.subscribe(uri)
                self._upstream[key] = upstream
        except GatewayError as exc:
            raise MCPError.from_error_data(to_error_data(exc)) from exc
        self._subscribers[key][session] = params.uri
        logger.info("session %s subscribed to %s (%s on %s)", session.id, params.uri, uri, upstream.id)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        """The ``resources/unsubscribe`` handler."""
        session = _session(ctx)
        for key, subscribers in list(self._subscribers.items()):
            if subscribers.get(session) == params.uri:
                await self._leave(key, session)
        return types.EmptyResult()

    async def session_ended(self, session: DownstreamSession) -> None:
        for key, subscribers in list(self._subscribers.items()):
            if session in subscribers:
                await self._leave(key, session)

    async def _leave(self, key: Key, session: DownstreamSession) -> None:
        subscribers = self._subscribers[key]
        subscribers.pop(session, None)
        if subscribers:
            return
        del self._subscribers[key]
        upstream = self._upstream.pop(key, None)
        if upstream is not None and upstream.client is not None:
            with anyio.move_on_after(_SEND_TIMEOUT):
                try:
                    await upstream.subscribe(key[1], subscribe=False)
                except GatewayError as exc:  # the upstream may be gone already: nothing left to undo
                    logger.info("unsubscribe %s on %s: %s", key[1], upstream.id, exc)

    async def updated(self, upstream: UpstreamSession, uri: str) -> None:
        """Relay one upstream update to the clients subscribed through ``upstream``."""
        for session, public in list(self._subscribers.get((upstream.id, uri), {}).items()):
            if session.connection is not None:
                with anyio.move_on_after(_SEND_TIMEOUT):
                    await session.connection.send_resource_updated(public)

    @property
    def count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())


def _session(ctx: Any) -> DownstreamSession:
    current = sessions.CURRENT.get()
    if current is not None:
        return current
    known = ctx.session._connection.state.get(sessions.STATE_KEY)
    if isinstance(known, DownstreamSession):
        return known
    raise MCPError(code=types.INVALID_REQUEST, message="resources/subscribe outside a known session")
