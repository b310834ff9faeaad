"""Modern-era clients' ``subscriptions/listen`` streams while they are open: at most
``server.max_listen_streams`` of them, shared fairly.

Each stream is a session while it is open, so one client holds at most its ``max_sessions``;
but a few clients together could still hold every stream. At the bound a newcomer's stream
takes the place of the oldest of the client holding the most, when that client holds at least
two more than the newcomer's (the ended stream's client listens again, as after a drain);
otherwise it is refused. So the clients filling the bound are the ones that give way.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ServerEvent

from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.errors import GatewayBusy, to_wire
from agent_gateway.refusals import refused

logger = logging.getLogger(__name__)


class Listeners:
    """The open listen streams: each one's own events (its resource updates) and handler."""

    def __init__(self, catalog_events: InMemorySubscriptionBus, max_streams: int) -> None:
        self._catalog_events = catalog_events
        self._max_streams = max_streams
        self._streams: dict[DownstreamSession, tuple[InMemorySubscriptionBus, ListenHandler]] = {}
        """Every listen request's own events and handler, from its start (its subscriptions
        are being made) to its end."""
        self._serving: dict[DownstreamSession, None] = {}
        """The streams past ``admit``, oldest first: what the bound counts."""
        self._ending: set[DownstreamSession] = set()
        """Streams ended to make room for another's, until their handlers return."""
        self._closed = False
        """Draining or stopping: streams are closed and no new one is opened."""

    @asynccontextmanager
    async def opened(self, session: DownstreamSession) -> AsyncIterator[ListenHandler]:
        """``session``'s listen request, within: its handler, to serve the stream once its
        subscriptions are made and ``admit`` lets it in.

        Raises:
            MCPError: the gateway is closing its streams.
        """
        self.check_open()
        own = InMemorySubscriptionBus()
        handler = ListenHandler(_Joined(self._catalog_events, own), max_subscriptions=1)
        self._streams[session] = (own, handler)
        try:
            yield handler
        finally:
            del self._streams[session]
            self._serving.pop(session, None)
            self._ending.discard(session)

    def admit(self, session: DownstreamSession) -> None:
        """Let ``session``'s stream be served, within the bound: call it just before its
        handler, with no await between (the handler registers its stream before its first),
        so every stream ``_make_room`` may end is one its handler can close. A request that
        fails before this (an unknown URI, a subscription refused) ends no one's stream.

        Raises:
            MCPError: the gateway is closing its streams; or it holds its bound and none makes
                way; or this stream was itself ended to make way while its subscriptions were
                being made.
        """
        self.check_open()
        if session in self._ending:
            raise to_wire(GatewayBusy("agent-gateway: listen stream limit reached"))
        if len(self._serving) - len(self._ending) >= self._max_streams:
            self._make_room(session)
        self._serving[session] = None

    def check_open(self) -> None:
        """Refuse a stream while the gateway is draining: its client listens again, elsewhere.

        Raises:
            MCPError: draining.
        """
        if self._closed:
            raise to_wire(GatewayBusy("agent-gateway: shutting down, listen elsewhere"))

    def _make_room(self, newcomer: DownstreamSession) -> None:
        """End the oldest stream of the client holding the most, when it holds at least two
        more than ``newcomer``'s client (so the stream moves to a fairer share); else refuse.

        Raises:
            MCPError: no stream makes way.
        """
        open_now = [s for s in self._serving if s not in self._ending]  # oldest first
        held = Counter(s.label for s in open_now)
        largest, most = held.most_common(1)[0] if held else ("", 0)
        mine = held.get(newcomer.label, 0)
        if most < mine + 2:
            refused(
                "listen_streams", "client %s refused a listen stream: the gateway holds its %d, "
                "%d of them its own", newcomer.label, self._max_streams, mine, peer=newcomer.label,
            )  # fmt: skip
            raise to_wire(GatewayBusy("agent-gateway: listen stream limit reached"))
        victim = next(s for s in open_now if s.label == largest)
        self._ending.add(victim)
        self._streams[victim][1].close()
        logger.info(
            "listen stream of %s (%d open) ended for one of %s: the gateway holds its %d",
            largest, most, newcomer.label, self._max_streams,
        )  # fmt: skip

    def own(self, session: DownstreamSession) -> InMemorySubscriptionBus | None:
        """``session``'s stream's own events, while it is open."""
        stream = self._streams.get(session)
        return stream[0] if stream is not None else None

    def end(self, session: DownstreamSession) -> bool:
        """End ``session``'s stream gracefully, if it is open (its client listens again);
        whether it was."""
        if (stream := self._streams.get(session)) is None:
            return False
        stream[1].close()
        return True

    def streams(self) -> dict[DownstreamSession, InMemorySubscriptionBus]:
        """Each open stream's own events (what only its client is told)."""
        return {session: own for session, (own, _) in self._streams.items()}

    def close(self) -> None:
        """End every open stream gracefully, and open no more (draining, shutdown)."""
        self._closed = True
        for _, handler in list(self._streams.values()):
            handler.close()


class _Joined:
    """One listen stream's events: the catalog's, shared by all, and its own resource updates."""

    def __init__(self, shared: InMemorySubscriptionBus, own: InMemorySubscriptionBus) -> None:
        self._shared = shared
        self._own = own

    async def publish(self, event: ServerEvent) -> None:
        await self._own.publish(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        leave_shared = self._shared.subscribe(listener)
        leave_own = self._own.subscribe(listener)

        def unsubscribe() -> None:
            leave_shared()
            leave_own()

        return unsubscribe
