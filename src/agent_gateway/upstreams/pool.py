"""All upstreams together: started concurrently, looked up by name, reported on, stopped."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio
from anyio.abc import TaskGroup

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamUnavailable
from agent_gateway.upstreams.connection import Upstream, UpstreamState
from agent_gateway.upstreams.guard import Circuit, Guard
from agent_gateway.upstreams.lifecycle import Hooks
from agent_gateway.upstreams.session import UpstreamSession
from agent_gateway.upstreams.translation import secrets_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """What ``/readyz`` and ``agent-gateway tools`` report about one upstream."""

    name: str
    transport: str
    state: UpstreamState
    circuit: Circuit
    last_error: str | None
    down_for_seconds: float | None
    """Time since it was last up (or since start-up, if it never was); None while up."""
    last_up_at: float | None
    """When it last became up (epoch seconds); None if it never was."""
    connections: int
    in_flight: int
    listing_refused: str | None = None
    """Why its latest listing was refused (a name collision), its earlier one served."""
    window: int | None = None
    """Clients' calls sent to it at once while its shared session's pings say it has calls
    queued (``queueing.py``); None while they are sent as they come."""
    sent: int = 0
    """Clients' calls sent through its turns and not yet answered, on its shared session and
    its dedicated ones: the ones the window counts (``in_flight`` also counts the gateway's
    own requests)."""
    waiting: int = 0
    """Clients' calls waiting in the gateway for their turn to be sent to it."""

    @property
    def serving(self) -> bool:
        """Connected, and its calls are being sent (circuit not open)."""
        return self.state == UpstreamState.UP and self.circuit != Circuit.OPEN

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "transport": self.transport,
            "state": str(self.state),
            "circuit": str(self.circuit),
            "last_error": self.last_error,
            "down_for_seconds": None if self.down_for_seconds is None else round(self.down_for_seconds, 1),
            "last_up_at": None if self.last_up_at is None else _iso(self.last_up_at),
            "connections": self.connections,
            "in_flight": self.in_flight,
            "listing_refused": self.listing_refused,
            "window": self.window,
            "sent": self.sent,
            "waiting": self.waiting,
        }


_STOP_TIMEOUT = 10.0


class _Life:
    """One upstream's task, which can be stopped alone (the others run on)."""

    def __init__(self) -> None:
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()

    async def run(self, upstream: Upstream) -> None:
        try:
            with self._scope:
                await upstream.run()
        finally:
            self._done.set()

    async def stop(self) -> None:
        self._scope.cancel()
        # The transport's own shutdown is shielded and bounded; this bounds the wait for it.
        with anyio.move_on_after(_STOP_TIMEOUT):
            await self._done.wait()


STOPPED_BY_RELOAD = "the upstream was stopped by a configuration reload"
_POLL = 0.05


async def _calls_ended(upstream: Upstream, grace: float) -> None:
    """Until ``upstream``'s calls in flight have ended, at most ``grace`` seconds."""
    if upstream.guard.in_flight == 0 or grace <= 0:
        return
    logger.info(
        "reload: %s has %d calls in flight, given %gs to end", upstream.name, upstream.guard.in_flight, grace
    )
    with anyio.move_on_after(grace):
        while upstream.guard.in_flight:  # noqa: ASYNC110  (polled: no event marks the count's end)
            await anyio.sleep(_POLL)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


class UpstreamPool:
    """Holds one ``Upstream`` per configured server."""

    def __init__(self, configs: Mapping[str, UpstreamConfig], hooks: Hooks) -> None:
        self._make = lambda name, config: Upstream(name, config, hooks)
        self.upstreams = {name: self._make(name, config) for name, config in configs.items()}
        self._tg: TaskGroup | None = None
        self._lives: dict[str, _Life] = {}

    @asynccontextmanager
    async def running(self, *, settle_timeout: float | None = None) -> AsyncIterator[UpstreamPool]:
        """Connect every upstream concurrently; yield once each has connected or failed once.

        A failed upstream does not stop the others: it keeps retrying in the background.
        Leaving the context closes every connection and reaps every child process.
        """
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for upstream in self.upstreams.values():
                self._start(upstream)
            await self._settle(settle_timeout)
            try:
                yield self
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    def _start(self, upstream: Upstream) -> None:
        assert self._tg is not None, "the pool is running"
        life = self._lives[upstream.name] = _Life()
        self._tg.start_soon(life.run, upstream, name=f"upstream {upstream.name}")

    async def add(self, name: str, config: UpstreamConfig, wait: float) -> Upstream:
        """Start a new upstream, or the one ``remove`` left in the place of one it restarts
        (configuration reload); return once it has connected or failed once, or after
        ``wait`` seconds (it goes on connecting meanwhile)."""
        upstream = self.upstreams.get(name)
        if upstream is None or upstream.config != config or name in self._lives:
            upstream = self.upstreams[name] = self._make(name, config)
        self._start(upstream)
        with anyio.move_on_after(wait):
            await upstream.settled.wait()
        return upstream

    async def remove(self, name: str, grace: float = 0.0, restart: UpstreamConfig | None = None) -> None:
        """Stop an upstream (configuration reload): its calls in flight are given ``grace``
        seconds to end (new ones no longer find it), then fail saying why; its process is
        reaped. Cut at once, a reload's calls failed with a bare "Connection closed".
        ``restart``: it is restarted with this configuration (``add`` starts it): new calls
        find the new one at once, and wait for it (``Upstream.ready``)."""
        upstream = self.upstreams.pop(name, None)
        if restart is not None:
            self.upstreams[name] = self._make(name, restart)
            self.upstreams[name].restarting = True
        if upstream is not None:
            await _calls_ended(upstream, grace)
            if (session := upstream.live_session()) is not None:
                session.lose(STOPPED_BY_RELOAD)
        if (life := self._lives.pop(name, None)) is not None:
            await life.stop()

    def every_upstream(self) -> float:
        """Seconds until every upstream has connected or failed once: the longest connect_timeout."""
        return max((u.config.connect_timeout for u in self.upstreams.values()), default=0.0)

    async def _settle(self, limit: float | None) -> None:
        bound = limit if limit is not None else self.every_upstream()
        with anyio.move_on_after(bound + 1):
            for upstream in self.upstreams.values():
                await upstream.settled.wait()
        for status in self.statuses():
            if status.last_error:
                logger.warning(
                    "upstream %s unavailable at start-up: %s (retrying)", status.name, status.last_error
                )

    def get(self, name: str) -> Upstream:
        """The upstream called ``name``.

        Raises:
            UpstreamUnavailable: no such upstream is configured.
        """
        upstream = self.upstreams.get(name)
        if upstream is None:
            raise UpstreamUnavailable(name, "not configured")
        return upstream

    def secrets(self, name: str) -> tuple[str, ...]:
        """What upstream ``name`` is sent that nothing the gateway writes may repeat."""
        upstream = self.upstreams.get(name)
        return secrets_of(upstream.config) if upstream is not None else ()

    def up_states(self) -> list[tuple[str, bool]]:
        return [(s.name, s.serving) for s in self.statuses()]

    def statuses(self, refused: Mapping[str, str] | None = None) -> list[UpstreamStatus]:
        """Each upstream's status; ``refused``: the catalog's refused listings, by upstream."""
        now = time.time()
        return [_status(u, now, (refused or {}).get(u.name)) for u in self.upstreams.values()]

    def live_sessions(self) -> list[UpstreamSession]:
        """The shared sessions of the upstreams connected now."""
        return [s for u in self.upstreams.values() if (s := u.live_session()) is not None]

    def showed(self, session_id: str) -> bool:
        """Whether a shared session keeps URL elicitations it showed ``session_id`` (its end
        then has something to release: ``client_ended``)."""
        return any(session.replies.showed(session_id) for session in self.live_sessions())

    def client_ended(self, session_id: str) -> None:
        """Downstream session ``session_id`` ended: the shared sessions forget what they kept
        for it (a dedicated one ends with it)."""
        for session in self.live_sessions():
            session.replies.client_ended(session_id)

    @property
    def ready(self) -> bool:
        return all(s.serving for s in self.statuses())


def _status(u: Upstream, now: float, refused: str | None) -> UpstreamStatus:
    queue = u.queue
    return UpstreamStatus(
        name=u.name,
        transport=u.config.kind,
        state=u.state,
        circuit=u.guard.circuit,
        last_error=u.last_error or _breaker_error(u.guard),
        down_for_seconds=None if u.down_since is None else now - u.down_since,
        last_up_at=u.up_since,
        connections=u.connections,
        in_flight=u.guard.in_flight,
        listing_refused=refused,
        window=queue.held_back,
        sent=queue.sent,
        waiting=queue.waiting,
    )


def _breaker_error(guard: Guard) -> str | None:
    if guard.breaker is None or guard.circuit == Circuit.CLOSED:
        return None
    return f"circuit {guard.circuit}: {guard.breaker.last_failure}"
