"""Resource subscriptions routed between subscribing clients and the upstream owning the resource.

A client subscribes to a public URI: with ``resources/subscribe`` in the handshake era, by
naming it in a ``subscriptions/listen`` stream in the modern era. The gateway subscribes
once upstream per upstream session and URI, however many clients share it, and unsubscribes
when the last one leaves (or its session ends). Each update from an upstream session goes to
exactly the clients subscribed through that session, under each URI they used (a URI and its
alias, ``file:///a`` and ``docs+file:///a``, are two subscriptions of one upstream's).

A session holds at most its client's ``max_subscriptions``. When it ends, its subscriptions
leave the tables at once and the upstream unsubscribes go out a few at a time within a
bound: one not sent in time is left to the upstream session's end, never kept as live.

With several replicas (``Holders``), a handshake-era session's subscriptions are in its
shared record, with the replica holding each: a replica that serves the session's
notification stream takes over those whose holder died or let go (``take_over``); the holder
of one its client dropped through another replica leaves it (``dropped_elsewhere``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from functools import partial
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp.shared.exceptions import MCPError

from agent_gateway.access import Principal
from agent_gateway.compat.mcp import connection_of
from agent_gateway.downstream import sessions
from agent_gateway.downstream.listeners import Listeners
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.downstream.subscription_bounds import RELEASE_TIMEOUT, Leaving, check_room, each_bounded
from agent_gateway.downstream.update_sends import UpdateSends
from agent_gateway.errors import GatewayError, InvalidRequest, to_wire
from agent_gateway.proxy import Proxy
from agent_gateway.runtime import SEND_TIMEOUT
from agent_gateway.turns import away
from agent_gateway.upstreams.session import UpstreamSession

logger = logging.getLogger(__name__)

JOIN_CONCURRENCY = 16
"""Subscribes of one listen stream sent upstream at once: one at a time, a stream naming a
thousand resources of a remote upstream waited a thousand round trips before it opened."""

Key = tuple[str, str]
"""(upstream session id, upstream URI): a session holds one by each public URI it subscribed by."""
Released = tuple[Key, str, UpstreamSession | None]
"""An ended session's subscription: its key, its public URI, the upstream session to leave
(None: others are still subscribed)."""


class Holders(Protocol):
    """Where several replicas record which one holds each subscription (``store/holders.py``)."""

    async def held(self, session_id: str, uri: str) -> None: ...
    async def let_go(self, session_id: str, uri: str) -> None: ...
    async def dropped(self, session_id: str, uri: str) -> None: ...
    async def orphaned(self, session_id: str) -> list[str]: ...


class ResourceSubscriptions:
    """Who is subscribed to what, through which upstream session."""

    def __init__(
        self,
        proxy: Proxy,
        catalog_events: InMemorySubscriptionBus,
        holders: Holders | None = None,
        max_streams: int = 1024,
    ) -> None:
        """``max_streams``: listen streams open at once (``server.max_listen_streams``)."""
        self._proxy = proxy
        self._holders = holders
        self._subscribers: dict[Key, dict[DownstreamSession, tuple[str, ...]]] = defaultdict(dict)
        self._held: dict[DownstreamSession, set[tuple[Key, str]]] = {}
        """Each subscribed session's subscriptions, one by name (what its bound counts): a
        session's end (every modern-era request is one) touches its own, not everyone's."""
        self._upstream: dict[Key, UpstreamSession] = {}
        self._listeners = Listeners(catalog_events, max_streams)
        self._locks: dict[Key, anyio.Lock] = {}
        """One per key: subscribing and unsubscribing upstream happen one at a time."""
        self._joining: dict[DownstreamSession, int] = {}
        """Subscriptions each session is making now, counted against its bound with those held."""
        self._leaving = Leaving()
        self.sends = UpdateSends()  # resource updates and list changes to handshake-era sessions

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """The ``resources/subscribe`` handler (handshake-era clients)."""
        async with away():  # the upstream's time: its client's next request is worked on
            await self._join(_session(ctx), params.uri)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        """The ``resources/unsubscribe`` handler."""
        session = _session(ctx)
        async with away():
            for key, public in list(self._held.get(session, ())):
                if public == params.uri:
                    await self._leave(key, session, public)
            if self._holders is not None and session.connection is not None:
                await self._holders.dropped(session.id, params.uri)
        return types.EmptyResult()

    async def listen(
        self, ctx: Any, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """The ``subscriptions/listen`` handler (modern clients): one stream of catalog changes
        and of updates to the resources it names, subscribed upstream for as long as it is open.
        """
        session = _session(ctx)
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        check_room(session, len(uris))  # refused before any is subscribed upstream
        async with self._listeners.opened(session) as handler:
            await self._join_all(session, uris)
            # Streams may have been closed meanwhile; and only a stream about to be served
            # may take another's place (the handler opens its stream before its first await).
            self._listeners.admit(session)
            # The request's session ends with the stream; that leaves its subscriptions.
            return await handler(ctx, params)

    async def _join_all(self, session: DownstreamSession, uris: list[str]) -> None:
        """Subscribe ``session`` to ``uris``, ``JOIN_CONCURRENCY`` at a time. Once one fails no
        more are begun, those under way finish (not cancelled half-way, where the upstream could
        keep one for nobody), and the failure of the first named is raised; the ones made are
        left with the request's session, as when they were made one at a time."""
        queue = enumerate(uris)
        failed: dict[int, MCPError] = {}

        async def worker() -> None:
            for index, uri in queue:  # shared: each URI is taken by one worker
                if failed:
                    return
                try:
                    await self._join(session, uri)
                except MCPError as exc:
                    failed[index] = exc

        async with anyio.create_task_group() as tg:
            for _ in range(min(JOIN_CONCURRENCY, len(uris))):
                tg.start_soon(worker)
        if failed:
            raise failed[min(failed)]

    def streams(self) -> dict[DownstreamSession, InMemorySubscriptionBus]:
        """Each open listen stream's own events (what only its client is told)."""
        return self._listeners.streams()

    def end_stream(self, session: DownstreamSession) -> bool:
        """End ``session``'s listen stream gracefully, if it has one open (its client listens
        again); whether it had."""
        return self._listeners.end(session)

    def close_streams(self) -> None:
        """End every open listen stream gracefully, and open no more (draining, shutdown)."""
        self._listeners.close()

    def holds(self, session: DownstreamSession) -> bool:
        """Whether ``session`` is subscribed to anything here."""
        return bool(self._held.get(session))

    def held(self, session: DownstreamSession) -> list[str]:
        """The URIs ``session`` is subscribed to here."""
        return [public for _, public in self._held.get(session, ())]

    async def session_ended(self, session: DownstreamSession) -> None:
        """``session`` ended here: its subscriptions leave the tables at once, then are left
        upstream, ``RELEASE_CONCURRENCY`` at a time within ``RELEASE_TIMEOUT`` (one not sent
        by then stays upstream, for nobody, until that upstream session ends). With several
        replicas they are let go, not dropped: the session may live on another replica, which
        takes them over (a session ended everywhere takes its record, and them, with it)."""
        released = self._drop(session)
        shared = self._holders is not None and session.connection is not None
        left, why = await each_bounded([partial(self._release, session, each, shared) for each in released])
        if left:  # one line, whatever the count: they are forgotten here either way
            what = f"{left} of its {len(released)} subscriptions not let go upstream in {RELEASE_TIMEOUT:g}s"
            logger.warning(
                "session %s ended: %s%s; they end with their upstream session", session.id, what, why
            )

    def dropped_elsewhere(self, session_id: str, public: str) -> None:
        """``session_id``'s subscription to ``public``, held here, was dropped by its client
        through another replica: out of the tables now, left upstream by ``Leaving`` (no
        wait: the replicas' channel calls this)."""
        session = next((s for s in self._held if s.id == session_id), None)
        if session is None:
            return
        for released in self._drop(session, public):
            logger.info(
                "session %s: its subscription to %s dropped through another replica", session_id, public
            )
            if released[2] is not None and not self._leaving.put(
                partial(self._release, session, released, False)
            ):
                logger.warning(
                    "session %s: %s left to its upstream session's end (too many to leave)",
                    session_id,
                    public,
                )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Subscriptions dropped through another replica left upstream, and updates sent, while inside."""
        async with self.sends.running(), anyio.create_task_group() as tg:
            await tg.start(self._leaving.run)
            yield
            tg.cancel_scope.cancel()

    def _drop(self, session: DownstreamSession, only: str | None = None) -> list[Released]:
        """Take ``session`` out of every table (no await: nothing sees it half gone), or out of
        its subscription to ``only``; each subscription taken, with the upstream session to
        unsubscribe on if it was the last."""
        dropped: list[Released] = []
        for key, public in list(self._held.get(session, ())):
            if only is not None and public != only:
                continue
            self._forget(session, key, public)
            subscribers = self._subscribers.get(key, {})
            if kept := tuple(n for n in subscribers.get(session, ()) if n != public):
                subscribers[session] = kept  # its other name still holds the upstream's
                dropped.append((key, public, None))
                continue
            subscribers.pop(session, None)
            upstream = None
            if not subscribers:
                self._subscribers.pop(key, None)
                upstream = self._upstream.pop(key, None)
            dropped.append((key, public, upstream))
        return dropped

    async def _release(self, session: DownstreamSession, released: Released, shared: bool) -> None:
        key, public, upstream = released
        if upstream is not None:
            async with self._lock(key):
                if key not in self._upstream:  # else subscribed again meanwhile: keep it
                    await self._unsubscribe(key, upstream)
            self._free_lock(key)
        if shared and self._holders is not None:
            await self._holders.let_go(session.id, public)

    async def take_over(self, session: DownstreamSession) -> None:
        """Subscribe here to ``session``'s subscriptions that no replica holds now, and tell
        its client each may have changed meanwhile (nobody relayed its updates)."""
        if self._holders is None or session.connection is None:
            return
        for public in await self._holders.orphaned(session.id):
            try:
                await self._join(session, public)
            except MCPError as exc:
                logger.warning("session %s: subscription to %s not taken over: %s", session.id, public, exc)
                await self._holders.dropped(session.id, public)
                continue
            logger.info("session %s: subscription to %s taken over from another replica", session.id, public)
            with anyio.move_on_after(SEND_TIMEOUT):
                await session.connection.send_resource_updated(public)

    async def _join(self, session: DownstreamSession, public: str) -> None:
        try:
            upstream, uri = await self._proxy.resource_session(public, session, session.client)
            key = (upstream.id, uri)
            with self._room(session, (key, public)):
                async with self._lock(key):
                    if key not in self._upstream:
                        with _calling(session.client):  # a call in flight, as any: else one
                            await upstream.subscribe(uri)  # client's flood took the upstream's slots
                        self._upstream[key] = upstream
                    if public not in (names := self._subscribers[key].get(session, ())):
                        self._subscribers[key][session] = (*names, public)
                    self._held.setdefault(session, set()).add((key, public))
        except GatewayError as exc:
            raise to_wire(exc) from exc
        if self._holders is not None and session.connection is not None:
            await self._holders.held(session.id, public)
        logger.info("session %s subscribed to %s (%s on %s)", session.id, public, uri, upstream.id)

    @contextmanager
    def _room(self, session: DownstreamSession, name: tuple[Key, str]) -> Iterator[None]:
        """``name`` subscribed for ``session`` inside, within its bound (each name counts, a URI
        and its alias two; one it holds takes no more room; one being made counts, so concurrent
        requests cannot pass it); its key's lock let go after (else a refused one kept it)."""
        held = self._held.get(session, set())
        joining = self._joining.get(session, 0)
        if name not in held:
            check_room(session, len(held) + joining + 1)
        self._joining[session] = joining + 1
        try:
            yield
        finally:
            if (left := self._joining.pop(session) - 1) > 0:
                self._joining[session] = left
            self._free_lock(name[0])

    async def _leave(self, key: Key, session: DownstreamSession, public: str) -> None:
        async with self._lock(key):
            self._forget(session, key, public)
            subscribers = self._subscribers.get(key, {})
            if kept := tuple(n for n in subscribers.get(session, ()) if n != public):
                subscribers[session] = kept  # subscribed by its other name too: still is
                return
            subscribers.pop(session, None)
            if subscribers:
                return
            self._subscribers.pop(key, None)
            await self._unsubscribe(key, self._upstream.pop(key, None))
        self._free_lock(key)

    async def _unsubscribe(self, key: Key, upstream: UpstreamSession | None) -> None:
        if upstream is not None and upstream.client is not None:
            with anyio.move_on_after(SEND_TIMEOUT):
                try:
                    await upstream.subscribe(key[1], subscribe=False)
                except GatewayError as exc:  # the upstream may be gone already: nothing to undo
                    logger.info("unsubscribe %s on %s: %s", key[1], upstream.id, exc)

    def _free_lock(self, key: Key) -> None:
        lock = self._locks.get(key)
        if lock is not None and not lock.locked() and lock.statistics().tasks_waiting == 0:
            del self._locks[key]

    def _forget(self, session: DownstreamSession, key: Key, public: str) -> None:
        held = self._held.get(session)
        if held is not None:
            held.discard((key, public))
            if not held:
                del self._held[session]

    def _lock(self, key: Key) -> anyio.Lock:
        return self._locks.setdefault(key, anyio.Lock())

    async def upstream_ended(self, upstream: UpstreamSession) -> None:
        """``upstream`` is gone, and its subscriptions with it: tell their clients.

        A modern client's listen stream is ended, so it listens again (reaching the upstream's
        next session); a handshake-era client is sent ``resources/updated`` to read the
        resource again, and must subscribe again for further updates.
        """
        lost: list[tuple[DownstreamSession, str]] = []
        for key in [k for k in self._subscribers if k[0] == upstream.id]:
            subscribers = self._subscribers.pop(key)
            self._upstream.pop(key, None)
            self._locks.pop(key, None)
            for session, public in [(s, public) for s, names in subscribers.items() for public in names]:
                self._forget(session, key, public)
                lost.append((session, public))
        if not lost:
            return
        # One line, not one per subscription: at shutdown they are many.
        logger.warning(
            "upstream session %s ended: %d subscriptions of %d sessions lost; their clients are told",
            upstream.id,
            len(lost),
            len({session for session, _ in lost}),
        )
        await each_bounded([partial(self._tell_lost, session, public) for session, public in lost])

    async def _tell_lost(self, session: DownstreamSession, public: str) -> None:
        if self._holders is not None and session.connection is not None:
            await self._holders.dropped(session.id, public)  # it must subscribe again
        if session.connection is not None:  # queued: stuck clients took every turn of each_bounded
            self.sends.send(session, public)
        else:
            self._listeners.end(session)

    async def updated(self, upstream: UpstreamSession, uri: str) -> None:
        """Relay one upstream update to the clients subscribed through ``upstream``."""
        subscribers = self._subscribers.get((upstream.id, uri), {})
        for session, public in [(s, public) for s, names in subscribers.items() for public in names]:
            client = session.client
            if client is not None and not self._proxy.follows(client, upstream.name, uri, public):
                continue  # a reload took it out of the client's policy: its subscription stays mute
            if session.connection is not None:  # queued: one client not reading holds up no other's
                self.sends.send(session, public)
            elif (own := self._listeners.own(session)) is not None:  # its listeners never wait
                await own.publish(ResourceUpdated(uri=public))

    @property
    def count(self) -> int:
        return sum(len(names) for s in self._subscribers.values() for names in s.values())


def _session(ctx: Any) -> DownstreamSession:
    current = sessions.CURRENT.get()
    if current is not None:
        return current
    known = connection_of(ctx.session).state.get(sessions.STATE_KEY)
    if isinstance(known, DownstreamSession):
        return known
    raise to_wire(InvalidRequest("resources/subscribe outside a known session", types.INVALID_REQUEST))


def _calling(client: Principal | None) -> AbstractContextManager[None]:
    return client.calling() if client is not None else nullcontext()
