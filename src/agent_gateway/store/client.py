"""The connection to the shared store (Redis), and whether it can be reached now.

A replica that cannot reach Redis at start-up refuses to start with one clear message. One
that loses it while running keeps serving: each operation is bounded by ``store.timeout``;
a failure marks the store unavailable (logged once, ``/readyz`` says why, the
``agent_gateway.store.available`` gauge drops to 0) and the callers fall back to what this
replica knows; a watcher tries a write until one is taken again and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import anyio
from opentelemetry import metrics
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from agent_gateway.config import StoreConfig
from agent_gateway.errors import StoreUnavailable
from agent_gateway.shown_urls import without_password

logger = logging.getLogger(__name__)

_WATCH_INTERVAL = 1.0
_PROBE_KEPT_MS = 10_000
"""How long the watcher's probe key outlives its write (it is written only while the store is
unavailable)."""
_availability = metrics.get_meter("agent-gateway").create_up_down_counter(
    "agent_gateway.store.available",
    description="1 while the shared store (Redis) answers, 0 while it does not.",
)
failures = metrics.get_meter("agent-gateway").create_counter(
    "agent_gateway.store.failures",
    description="Shared-store operations that failed or timed out (the request went on without).",
)


class SharedStore:
    """The Redis client every shared-state part uses, with this replica's view of its health."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.redis: Redis = Redis.from_url(
            config.url,
            socket_timeout=config.timeout,
            socket_connect_timeout=config.timeout,
            health_check_interval=30,
            decode_responses=False,
            # A pooled connection Redis closed (it restarted) fails its next command: tried once
            # more on a fresh connection, not taken for the store being down. Without it, each
            # stale connection in the pool, used minutes later, marked the store unavailable
            # anew (503s, records not written). A timeout is not retried: it is the store's.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self.problem: str | None = "not connected yet"
        """Why the store is unavailable now, or None while it answers."""
        self.outages = 0
        """Times it became unavailable since start-up (what was written meanwhile is not in it)."""
        _availability.add(0)
        failures.add(0)  # a series from the start: a dashboard shows 0, not "no data"

    @property
    def available(self) -> bool:
        return self.problem is None

    def key(self, *parts: str) -> str:
        """A key (or channel) name under the configured prefix."""
        return ":".join((self.config.prefix, *parts))

    async def start(self) -> None:
        """Reach the store once.

        Raises:
            StoreUnavailable: it does not answer within ``store.timeout``.
        """
        try:
            with anyio.fail_after(self.config.timeout):
                await self.redis.ping()  # pyright: ignore[reportUnknownMemberType]  # redis-py's union return
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(
                f"the shared store {without_password(self.config.url)} cannot be reached: {_reason(exc)}"
            ) from exc
        self._mark_up()

    async def call(self, operation: Awaitable[Any], what: str) -> Any:
        """``operation``'s result, or None when the store failed (logged once, counted, watched).

        Untyped: redis-py's stubs give every command a union of sync and async answers; each
        caller states the shape it reads."""
        if not self.available:
            _close(operation)
            return None
        try:
            with anyio.fail_after(self.config.timeout):
                return await operation
        except (RedisError, OSError, TimeoutError) as exc:
            failures.add(1, {"operation": what})
            self._mark_down(f"{what}: {_reason(exc)}")
            return None

    async def watch(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Probe while the store is unavailable, and mark it up when it takes a write again."""
        task_status.started()
        while True:
            await anyio.sleep(_WATCH_INTERVAL)
            if self.available:
                continue
            try:
                with anyio.fail_after(self.config.timeout):
                    await self._probe()
            except (RedisError, OSError, TimeoutError) as exc:
                self.problem = f"the shared store does not answer: {_reason(exc)}"
                continue
            self._mark_up()

    async def _probe(self) -> None:
        # A write, as a request's scripts are: Redis paused for writes (``CLIENT PAUSE WRITE``,
        # as a failover pauses its primary) answers a PING at once and holds every script, so
        # a watcher that pinged marked it up each second, and the next request waited out
        # ``store.timeout`` again: most of the pause, not its first moment.
        await self.redis.set(self.key("probe"), b"1", px=_PROBE_KEPT_MS)  # pyright: ignore[reportUnknownMemberType]

    async def close(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.timeout):
            await self.redis.aclose()

    def _mark_up(self) -> None:
        if self.problem is not None:
            if self.problem != "not connected yet":
                logger.warning("shared store %s answers again", without_password(self.config.url))
            self.problem = None
            _availability.add(1)

    def _mark_down(self, problem: str) -> None:
        if self.problem is None:
            self.outages += 1
            logger.error(
                "shared store %s unavailable (%s): limits fall back to this replica's own, "
                "sessions started elsewhere cannot be adopted until it answers",
                without_password(self.config.url),
                problem,
            )
            _availability.add(-1)
        self.problem = problem


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _close(operation: Awaitable[Any]) -> None:
    """Close a coroutine that will not be awaited (no "never awaited" warning)."""
    close = getattr(operation, "close", None)
    if close is not None:
        close()
