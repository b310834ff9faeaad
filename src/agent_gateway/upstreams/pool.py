"""All upstreams together: started concurrently, looked up by name, reported on, stopped."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamUnavailable
from agent_gateway.upstreams.connection import DownCallback, ListingCallback, Upstream, UpstreamState
from agent_gateway.upstreams.guard import Circuit, Guard
from agent_gateway.upstreams.replies import Broadcast
from agent_gateway.upstreams.session import UpdateSink, UpstreamSession


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
        }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


class UpstreamPool:
    """Holds one ``Upstream`` per configured server."""

    def __init__(
        self,
        configs: Mapping[str, UpstreamConfig],
        on_listing: ListingCallback,
        broadcast: Broadcast | None = None,
        updates: UpdateSink | None = None,
        on_down: DownCallback | None = None,
    ) -> None:
        self.upstreams = {
            name: Upstream(name, config, on_listing, broadcast, updates, on_down)
            for name, config in configs.items()
        }

    @property
    def guards(self) -> dict[str, Guard]:
        """Each upstream's breaker and concurrency cap, for its dedicated sessions to share."""
        return {name: upstream.guard for name, upstream in self.upstreams.items()}

    @asynccontextmanager
    async def running(self, *, settle_timeout: float | None = None) -> AsyncIterator[UpstreamPool]:
        """Connect every upstream concurrently; yield once each has connected or failed once.

        A failed upstream does not stop the others: it keeps retrying in the background.
        Leaving the context closes every connection and reaps every child process.
        """
        async with anyio.create_task_group() as tg:
            for upstream in self.upstreams.values():
                tg.start_soon(upstream.run, name=f"upstream {upstream.name}")
            await self._settle(settle_timeout)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    async def _settle(self, limit: float | None) -> None:
        bound = (
            limit
            if limit is not None
            else max((u.config.connect_timeout for u in self.upstreams.values()), default=0)
        )
        with anyio.move_on_after(bound + 1):
            for upstream in self.upstreams.values():
                await upstream.settled.wait()

    def get(self, name: str) -> Upstream:
        """The upstream called ``name``.

        Raises:
            UpstreamUnavailable: no such upstream is configured.
        """
        upstream = self.upstreams.get(name)
        if upstream is None:
            raise UpstreamUnavailable(name, "not configured")
        return upstream

    def up_states(self) -> list[tuple[str, bool]]:
        return [(s.name, s.serving) for s in self.statuses()]

    def statuses(self) -> list[UpstreamStatus]:
        now = time.time()
        return [
            UpstreamStatus(
                name=u.name,
                transport=u.config.kind,
                state=u.state,
                circuit=u.guard.circuit,
                last_error=u.last_error or _breaker_error(u.guard),
                down_for_seconds=None if u.down_since is None else now - u.down_since,
                last_up_at=u.up_since,
                connections=u.connections,
                in_flight=u.guard.in_flight,
            )
            for u in self.upstreams.values()
        ]

    def live_sessions(self) -> list[UpstreamSession]:
        """The shared sessions of the upstreams connected now."""
        return [s for u in self.upstreams.values() if (s := u.live_session()) is not None]

    @property
    def ready(self) -> bool:
        return all(s.serving for s in self.statuses())


def _breaker_error(guard: Guard) -> str | None:
    if guard.breaker is None or guard.circuit == Circuit.CLOSED:
        return None
    return f"circuit {guard.circuit}: {guard.breaker.last_failure}"
