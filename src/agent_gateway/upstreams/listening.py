"""The ``subscriptions/listen`` streams of one modern (2026-07-28) upstream session.

That era has no ``resources/subscribe``: a subscription is an open listen stream naming the
URI. Each subscribed URI gets a stream of its own, hosted in the session's task group so it
ends with the session, re-opened with capped backoff when the upstream drops it, and
cancelled on unsubscribe.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, contextmanager

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, ResourceUpdated, Subscription, SubscriptionLost
from mcp.shared.exceptions import MCPError

from agent_gateway.errors import GatewayError, UpstreamUnavailable

logger = logging.getLogger(__name__)

_FIRST_DELAY = 1.0
_MAX_DELAY = 30.0

Calling = Callable[[str], AbstractContextManager[Client]]
"""The session's client for one bounded, translated request, named ``what`` in errors."""


class ListenStreams:
    """One listen stream per subscribed URI; each update is handed to ``updated``."""

    def __init__(self, name: str, session_id: str, calling: Calling, updated: Callable[[str], None]) -> None:
        self._name = name
        self._session_id = session_id
        self._calling = calling
        self._updated = updated
        self._tg: TaskGroup | None = None
        self._scopes: dict[str, anyio.CancelScope] = {}

    @contextmanager
    def hosted_by(self, tg: TaskGroup) -> Iterator[None]:
        """Streams run in ``tg`` while this context is open (the session's serving life)."""
        self._tg = tg
        try:
            yield
        finally:
            self._tg = None

    async def open(self, uri: str) -> None:
        """Listen for updates of ``uri`` (returns once the upstream acknowledged).

        Raises:
            UpstreamUnavailable, UpstreamTimeout, UpstreamRejected
        """
        if uri in self._scopes:
            return
        if self._tg is None:
            raise UpstreamUnavailable(self._name, f"subscribe {uri!r}: the session is not serving")
        self._scopes[uri] = await self._tg.start(self._run, uri)

    async def close(self, uri: str) -> None:
        scope = self._scopes.pop(uri, None)
        if scope is not None:
            scope.cancel()
        await anyio.lowlevel.checkpoint()

    async def _run(self, uri: str, *, task_status: TaskStatus[anyio.CancelScope]) -> None:
        """The stream for ``uri``, re-opened whenever it ends, until cancelled."""
        with anyio.CancelScope() as scope:
            started = False
            delay = _FIRST_DELAY
            while True:
                try:
                    async with self._stream(uri) as subscription:
                        if not started:
                            task_status.started(scope)
                            started = True
                        else:
                            # No replay in this era: what changed while the stream was down is
                            # unknown, so subscribers are told to read the resource again.
                            self._updated(uri)
                        delay = _FIRST_DELAY
                        async for event in subscription:
                            if isinstance(event, ResourceUpdated):
                                self._updated(event.uri)
                    reason = "closed by the upstream"
                except (GatewayError, SubscriptionLost, MCPError) as exc:
                    if not started:
                        raise
                    reason = str(exc) or type(exc).__name__
                logger.warning(
                    "listen stream for %s on %s ended (%s); re-listening in %.0fs",
                    uri,
                    self._session_id,
                    reason,
                    delay,
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)

    @asynccontextmanager
    async def _stream(self, uri: str) -> AsyncIterator[Subscription]:
        """An acknowledged listen stream for ``uri`` (the ack within the upstream's ``timeout``)."""
        what = f"subscriptions/listen {uri!r}"
        async with AsyncExitStack() as stack:
            with self._calling(what) as client:
                try:
                    subscription = await stack.enter_async_context(
                        client.listen(resource_subscriptions=[uri])
                    )
                except (SubscriptionLost, ListenNotSupportedError) as exc:
                    raise UpstreamUnavailable(self._name, f"{what}: {exc}") from exc
            yield subscription
