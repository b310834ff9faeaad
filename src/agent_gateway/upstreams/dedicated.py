"""Dedicated upstream sessions (``session: per_client``): one per downstream session and
upstream, opened on the first call that needs it and closed when the downstream session ends.

For stateful servers, roots and subscriptions: everything the upstream keeps, and everything
it sends back, belongs to one client.

The upstream's health checks run on its shared session, which can answer while one client's
session hangs (its own stdio process stopped, its HTTP session wedged upstream). So a call that
times out on a dedicated session is followed by a health check on that session; unanswered,
the session is given up (its calls fail as the connection lost) and the client's next call
opens another. Without it every later call of that client waited out its whole timeout.

Each such session may be a process, so an upstream holds at most its ``max_sessions`` of
them, and one client a quarter (at least one): else one client opening sessions by the
hundred would start as many processes. A new session past either bound takes the place of an
idle one (no call in flight or waiting its turn, no subscription, unused for ``_IDLE``
seconds): the client's own least recently used past its share, else one of the client holding
the most. With none idle it is refused (the client retries later; the others are served).

A modern-era (2026-07-28) client has no session: each request is one. An authenticated one's
dedicated sessions are its own across its requests (a *standing* owner, keyed by who it is),
and are closed once unused for ``server.session_idle_timeout``; else every request of it
started (and ended) a process, and a stateful upstream forgot between two calls what the
first did. An anonymous client's stay per request: clients behind one address (a NAT, a
proxy) cannot be told apart, and one must never see another's upstream state.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.session import IncomingMessage
from opentelemetry import context as otel_context
from opentelemetry.context import Context

from agent_gateway.compat.resumed import HttpSession
from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamBusy, UpstreamError, UpstreamUnavailable, describe
from agent_gateway.refusals import refused
from agent_gateway.runtime import CLEANUP_TIMEOUT, TaskHost
from agent_gateway.store.record import UpstreamRecord
from agent_gateway.store.sessions import SessionRecords
from agent_gateway.telemetry import health_failures
from agent_gateway.upstreams.guard import Guard
from agent_gateway.upstreams.lifecycle import UpdateSink, connected, nothing, probe, unanswered
from agent_gateway.upstreams.queueing import CallQueue
from agent_gateway.upstreams.session import ClientSide, UpstreamSession

logger = logging.getLogger(__name__)

_IDLE = 1.0
"""Seconds a dedicated session must go unused (and have no call waiting its turn there) before
a new one may take its place: a client between two calls keeps its own."""


class Shared(Protocol):
    """What a dedicated session shares with the upstream's others (``connection.Upstream``)."""

    guard: Guard
    queue: CallQueue
    config: UpstreamConfig


@dataclass(eq=False)
class _Dedicated:
    session: UpstreamSession
    client: str
    """Who holds it (its client's label): the key of its share of ``max_sessions``."""
    ready: anyio.Event = field(default_factory=anyio.Event)
    close: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None
    standing: bool = False
    """Its owner is a standing one: closed once unused for the idle timeout, not with a session."""
    record: UpstreamRecord | None = None
    """What the shared store holds of it, for another replica to resume it."""


class DedicatedSessions(TaskHost):
    """Opens, hands out and closes dedicated upstream sessions."""

    def __init__(
        self,
        configs: Mapping[str, UpstreamConfig],
        updates: UpdateSink | None = None,
        upstreams: Mapping[str, Shared] | None = None,
        records: SessionRecords | None = None,
        idle_timeout: float = 1800.0,
    ) -> None:
        """``upstreams``: the pool's, read as each session opens (a reload adds and restarts
        them): the guard, queue and configuration it takes. ``records``: with a shared store,
        each client session's dedicated sessions, for any replica to resume the same one.
        ``idle_timeout``: how long a standing owner's session is kept unused."""
        self._configs = configs
        self._idle_timeout = idle_timeout
        self._updates = updates
        self._upstreams = upstreams or {}
        self._records = records
        self._sessions: dict[str, dict[str, _Dedicated]] = {}
        """Owner (downstream session) -> upstream -> its session: a client's own found at once."""
        self.opened = 0

    @property
    def live(self) -> list[UpstreamSession]:
        return [entry.session for owned in self._sessions.values() for entry in owned.values()]

    async def get(
        self, upstream: str, owner: ClientSide, client: str, standing: bool = False
    ) -> UpstreamSession:
        """The dedicated session of ``owner`` (a session of ``client``) on ``upstream``, opened
        now if it has none. ``standing``: ``owner`` outlives requests (see the module
        docstring), and its session is closed once idle rather than with it.

        Raises:
            UpstreamUnavailable: it could not be opened within the upstream's connect_timeout.
            UpstreamBusy: the upstream holds its ``max_sessions``, or ``client`` its share of
                them, and none is idle.
        """
        config = self._config(upstream)
        entry = self._live(owner.session_id, upstream) or await self._open(upstream, owner, client, standing)
        entry.session.used = time.monotonic()  # in use from here: not taken for another's
        with anyio.move_on_after(config.connect_timeout + 1):
            await entry.ready.wait()
        entry.session.used = time.monotonic()  # however long it took to open
        if entry.session.client is None:
            reason = entry.error or f"no answer within connect_timeout ({config.connect_timeout:g}s)"
            raise UpstreamUnavailable(upstream, reason, what=f"dedicated session for {owner.session_id}")
        return entry.session

    def _live(self, session_id: str, upstream: str) -> _Dedicated | None:
        entry = self._sessions.get(session_id, {}).get(upstream)
        if entry is None or entry.done.is_set() or entry.close.is_set() or entry.session.lost.is_set():
            return None  # closed, closing, or lost
        return entry

    async def _open(self, upstream: str, owner: ClientSide, client: str, standing: bool) -> _Dedicated:
        if self._tg is None:
            raise UpstreamUnavailable(upstream, "the gateway is shutting down")
        if (shared := self._upstreams.get(upstream)) is not None and shared.guard.breaker is not None:
            shared.guard.breaker.refuse_if_open()
        await self._make_room(upstream, owner.session_id, client)
        if (entry := self._live(owner.session_id, upstream)) is not None:  # opened meanwhile
            return entry
        if self._tg is None:  # stopped while room was made
            raise UpstreamUnavailable(upstream, "the gateway is shutting down")
        entry = _Dedicated(self._new_session(upstream, owner), client, standing=standing)
        self._sessions.setdefault(owner.session_id, {})[upstream] = entry
        key = (owner.session_id, upstream)
        self._tg.start_soon(self._run, key, entry, name=f"dedicated {entry.session.id}")
        return entry

    async def _make_room(self, upstream: str, session_id: str, client: str) -> None:
        """Wait until ``upstream`` has room for one more session of ``client``, closing an
        idle one in its way (see the module docstring), or waiting (bounded) for one closing;
        at once when another call of session ``session_id`` opened its session meanwhile.

        Raises:
            UpstreamBusy: none is idle or closing.
        """
        config = self._config(upstream)
        cap = config.max_sessions
        share = config.max_sessions_per_client or max(1, cap // 4)
        bound = ""
        with anyio.move_on_after(CLEANUP_TIMEOUT):
            while self._live(session_id, upstream) is None:
                held = [e for owned in self._sessions.values() if (e := owned.get(upstream)) is not None]
                mine = [e for e in held if e.client == client]
                if len(mine) < share and len(held) < cap:
                    return
                over_share = len(mine) >= share
                bound = f"this client's {share} of its {cap}" if over_share else f"all its {cap}"
                way = mine if over_share else held
                if (victim := _idlest(way)) is not None:
                    logger.info(
                        "dedicated upstream session %s of %s closed for a new one of %s (%s sessions held)",
                        victim.session.id, victim.client, client, bound,
                    )  # fmt: skip
                    victim.close.set()
                elif (victim := next((e for e in way if e.close.is_set()), None)) is None:
                    break
                await victim.done.wait()
            else:  # its session is open now
                return
        refused(
            "dedicated_sessions",
            "no room for a session of %s on %s: %s in use",
            client,
            upstream,
            bound,
            peer=client,
        )
        raise UpstreamBusy(upstream, f"{bound} sessions (max_sessions) are in use; retry later")

    async def _run(self, key: tuple[str, str], entry: _Dedicated) -> None:
        # Started from a client's request, this task copied its trace context; the session
        # outlives that request, so its own traffic must not be traced as part of it.
        token = otel_context.attach(Context())
        try:
            await self._serve(key, entry)
        finally:
            otel_context.detach(token)

    async def _serve(self, key: tuple[str, str], entry: _Dedicated) -> None:
        try:
            found = await self._recorded(key, entry)
            if found is not None:
                try:
                    entry.record = found
                    await self._hold(key, entry, HttpSession(found.id, kept=True), found.result)
                    return
                except Exception as exc:
                    if entry.ready.is_set():
                        raise
                    assert self._records is not None
                    logger.info("upstream session of %s on %s not resumed (%s): opening another", *key, exc)
                    await self._records.upstream_lost(*key)
                    entry.record = None
                    entry.session = self._new_session(key[1], entry.session.owner)
            resumable = (
                self._records is not None
                and not entry.standing
                and entry.session.config.kind == "streamable-http"
            )
            await self._hold(key, entry, HttpSession(kept=True) if resumable else None, None)
        except Exception as exc:  # this session's life only: report to the waiting caller
            entry.error = exc.detail if isinstance(exc, UpstreamError) else describe(exc)
            logger.warning("dedicated upstream session %s failed: %s", entry.session.id, entry.error)
        finally:
            owned = self._sessions.get(key[0], {})
            if owned.get(key[1]) is entry:
                del owned[key[1]]
                if not owned:
                    del self._sessions[key[0]]
            entry.ready.set()
            entry.done.set()
            logger.info("dedicated upstream session %s closed", entry.session.id)

    async def _hold(
        self,
        key: tuple[str, str],
        entry: _Dedicated,
        link: HttpSession | None,
        resumed: types.InitializeResult | None,
    ) -> None:
        """Connect ``entry``'s session (resuming ``link``'s upstream session when ``resumed``
        is its handshake) and hold it until it is closed."""
        session = entry.session
        checked = _answers if resumed is not None else nothing
        async with connected(session, _ignore, self._updates, checked, link, resumed) as (client, tg, _):
            self.opened += 1
            if link is not None and resumed is None:
                entry.record = await self._record(key, client, link)
            entry.ready.set()
            how = "resumed" if resumed is not None else "opened"
            logger.info("dedicated upstream session %s %s for %s", session.id, how, key[0])
            if session.owner is not None and session.owner.log_level is not None:
                session.level.ask(session.owner.log_level)
                with session.translated("logging/setLevel"):
                    await session.set_logging_level(session.owner.log_level)
            tg.start_soon(_set_on, session.lost, entry.close)
            tg.start_soon(_answering, client, session)
            await (self._until_idle(entry) if entry.standing else entry.close.wait())
            if link is not None and self._records is not None:
                # Ended upstream only with the client's session everywhere (deleted, expired):
                # while it lives, another replica may be serving it on the same upstream session.
                # One given up is ended and forgotten: resumed, it would hang the next call again.
                link.kept = not session.given_up and await self._records.live(key[0]) is not False
                if session.given_up:
                    entry.record = None
                    await self._records.upstream_lost(*key)

    async def _until_idle(self, entry: _Dedicated) -> None:
        """Until ``entry`` is closed, or has gone unused (``_unused``) for the idle
        timeout. Each call's end stamps ``used``, so one wait per idle period suffices."""
        session = entry.session
        while True:
            unused = time.monotonic() - session.used
            busy = not _unused(session)
            with anyio.move_on_after(self._idle_timeout if busy else self._idle_timeout - unused):
                await entry.close.wait()
                return
            if _unused(session) and time.monotonic() - session.used >= self._idle_timeout:
                logger.info(
                    "dedicated upstream session %s of %s closed: unused for %gs",
                    session.id, entry.client, self._idle_timeout,
                )  # fmt: skip
                entry.close.set()  # closing: the owner's next call opens another
                return

    async def _recorded(self, key: tuple[str, str], entry: _Dedicated) -> UpstreamRecord | None:
        """The upstream session another replica opened for this client, to resume."""
        if self._records is None or entry.standing or self._config(key[1]).kind != "streamable-http":
            return None  # a standing owner has no client session record: each replica its own
        return await self._records.upstream_session(*key)

    async def _record(self, key: tuple[str, str], client: Client, link: HttpSession) -> UpstreamRecord | None:
        """Share a handshake-era upstream session's id, so another replica can resume it."""
        assert self._records is not None
        if (result := client.session.initialize_result) is None or link.session_id is None:
            return None
        record = UpstreamRecord(link.session_id, result)
        await self._records.upstream_opened(*key, record)
        return record

    def _new_session(self, upstream: str, owner: ClientSide | None) -> UpstreamSession:
        if (shared := self._upstreams.get(upstream)) is None:
            return UpstreamSession(upstream, self._configs[upstream], owner=owner)
        return UpstreamSession(upstream, shared.config, owner=owner, guard=shared.guard, queue=shared.queue)

    def _config(self, upstream: str) -> UpstreamConfig:
        """The pool's upstream's configuration (a reload replaces it before ``reconfigure``)."""
        shared = self._upstreams.get(upstream)
        return shared.config if shared is not None else self._configs[upstream]

    async def reconfigure(self, configs: Mapping[str, UpstreamConfig], closing: Iterable[str]) -> None:
        """Take a reloaded configuration; close the sessions on the ``closing`` upstreams (removed,
        or restarted) but those opened for the pool's new one, and wait (bounded) until they are."""
        self._configs, gone = configs, set(closing)
        stale = [e for owned in self._sessions.values() for u, e in owned.items() if u in gone]
        await self._close([e for e in stale if not self._current(e)])

    def _current(self, entry: _Dedicated) -> bool:
        """Whether ``entry`` shares the guard of the upstream the pool holds now."""
        shared = self._upstreams.get(entry.session.name)
        return shared is not None and entry.session.guard is shared.guard

    def records_of(self, downstream_id: str) -> dict[str, UpstreamRecord]:
        """The shared records of ``downstream_id``'s dedicated sessions, by upstream."""
        owned = self._sessions.get(downstream_id, {})
        return {upstream: e.record for upstream, e in owned.items() if e.record is not None}

    def holds(self, downstream_id: str) -> bool:
        """Whether ``downstream_id`` has dedicated sessions here (open or opening)."""
        return bool(self._sessions.get(downstream_id))

    async def close(self, downstream_id: str) -> None:
        """Close every dedicated session of ``downstream_id`` and wait (bounded) until they are."""
        await self._close(list(self._sessions.get(downstream_id, {}).values()))

    async def _close(self, entries: list[_Dedicated]) -> None:
        if not entries:  # most clients hold none: every modern-era request ends a session
            return
        for entry in entries:
            entry.close.set()
        with anyio.move_on_after(CLEANUP_TIMEOUT):
            for entry in entries:
                await entry.done.wait()


def _idlest(entries: list[_Dedicated]) -> _Dedicated | None:
    """Of ``entries``, the one to close for a new session: idle, of the client holding the
    most of them, least recently used; None if none is idle."""
    held = Counter(e.client for e in entries)
    now = time.monotonic()
    idle = [
        e
        for e in entries
        if e.ready.is_set() and not e.close.is_set() and _unused(e.session) and now - e.session.used >= _IDLE
    ]
    return max(idle, key=lambda e: (held[e.client], -e.session.used), default=None)


def _unused(session: UpstreamSession) -> bool:
    """No call in flight on ``session``, none waiting for its turn there, no subscription."""
    return session.pending == 0 and session.waiting == 0 and not session.subscribed


async def _set_on(source: anyio.Event, target: anyio.Event) -> None:
    await source.wait()
    target.set()


async def _answering(client: Client, session: UpstreamSession) -> None:
    """A health check on ``session`` after each of its calls that timed out (see the module
    docstring); unanswered, the session is given up."""
    while True:
        await session.doubted()
        if (reason := await unanswered(client, session)) is not None:
            health_failures.add(1, {"agent_gateway.upstream": session.name})
            logger.warning("dedicated upstream session %s given up: %s", session.id, reason)
            session.lose(reason, given_up=True)
            return


async def _answers(client: Client) -> None:
    """A resumed session is still known upstream (``probe``: ``send_ping`` warned at each)."""
    await probe(client)


async def _ignore(message: IncomingMessage) -> None:
    # Catalog changes are watched on the shared connection; nothing to do per client.
    await anyio.lowlevel.checkpoint()
