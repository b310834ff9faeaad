"""Everything the replicas share over one Redis client (``SharedState``), built only where
``store:`` is set (``store/__init__.py`` lists the parts)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio

from agent_gateway.config import GatewayConfig, StoreConfig
from agent_gateway.downstream.held_calls import HeldCalls
from agent_gateway.shown_urls import without_password
from agent_gateway.store.bus import Bus
from agent_gateway.store.client import SharedStore
from agent_gateway.store.events import LIVE, SharedEventStore
from agent_gateway.store.holders import DROPPED, SubscriptionHolders
from agent_gateway.store.keeper import SessionKeeper
from agent_gateway.store.leases import Leases
from agent_gateway.store.limits import SharedLimits
from agent_gateway.store.room import MAKE_WAY, SharedRoom
from agent_gateway.store.rounds import Rounds, rounds_channel
from agent_gateway.store.sessions import ENDED, LEVEL, RESTORED, SessionRecords

logger = logging.getLogger(__name__)

CATALOG = "catalog"
"""The channel on which a replica says which upstream's lists changed (``<replica> <name>``)."""

Refresh = Callable[[str], None]


class SharedState:
    """Everything the replicas share, over one Redis client."""

    def __init__(self, config: GatewayConfig, store: StoreConfig) -> None:
        idle = config.server.session_idle_timeout
        self.store = SharedStore(store)
        self.replica = uuid.uuid4().hex[:12]
        """This process among the replicas (its own announcements are not acted on twice)."""
        self.sessions = SessionRecords(self.store, idle, self.replica)
        self.keeper = SessionKeeper(self.store, self.sessions)
        self.limits = SharedLimits(self.store, idle, on_lost=self.keeper.lost)
        self.events = SharedEventStore(self.store, store.events)
        channels = (ENDED, LEVEL, RESTORED, CATALOG, LIVE, MAKE_WAY, DROPPED, rounds_channel(self.replica))
        self.bus = Bus(self.store, channels)
        self.bus.on(RESTORED, self.keeper.restored_elsewhere)
        self.room = SharedRoom(self.store, self.bus, self.sessions)
        self.leases = Leases(self.store)
        self.holders = SubscriptionHolders(self.store, self.bus, self.sessions, self.replica)

    def rounds(self, calls: HeldCalls) -> Rounds:
        """The rounds of ``calls`` (held here) asked for or served across the replicas."""
        return Rounds(self, calls)

    @property
    def problem(self) -> str | None:
        """Why this replica cannot use the shared store now (None: it can)."""
        return self.store.problem

    async def catalog_changed(self, upstream: str) -> None:
        """Tell the other replicas that ``upstream`` said its lists changed."""
        await self.bus.publish(CATALOG, f"{self.replica} {upstream}")

    def on_catalog_changed(self, refresh: Refresh) -> None:
        async def handle(message: str) -> None:
            replica, _, upstream = message.partition(" ")
            if replica != self.replica and upstream:
                refresh(upstream)

        self.bus.on(CATALOG, handle)

    def on_session_ended(self, drop: Callable[[str], Awaitable[None]]) -> None:
        """``drop`` each session deleted through another replica (its id)."""
        self.bus.on(ENDED, drop)
        self.keeper.drop_with(drop)

    def on_level_set(self, apply: Callable[[str, str], Awaitable[None]]) -> None:
        """``apply`` each session's new log level (its id, the level) set through another
        replica (``store/sessions.py``)."""

        async def handle(message: str) -> None:
            replica, _, rest = message.partition(" ")
            session_id, _, level = rest.partition(" ")
            if replica != self.replica:
                await apply(session_id, level)

        self.bus.on(LEVEL, handle)

    def on_notification(self, relay: Callable[[str], Awaitable[None]]) -> None:
        """``relay`` each notification-stream event any replica writes (``store/events.py``)."""
        self.bus.on(LIVE, relay)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SharedState]:
        """Reach the store (or raise ``StoreUnavailable``), then listen and watch until exit."""
        try:
            await self.store.start()
            logger.info("shared store: %s", without_password(self.store.config.url))
            async with anyio.create_task_group() as tg:
                await tg.start(self.store.watch)
                await tg.start(self.bus.listen)
                await tg.start(self.events.write)
                await tg.start(self.holders.beat)
                await tg.start(self.keeper.run)
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self.events.close()
            await self.store.close()
