"""The log levels of the shared upstream sessions worked out again when a handshake-era
client comes or goes, in a task of the gateway's own.

A client arriving or leaving asks nothing of any upstream, but may change the level a shared
upstream session should run at (``Proxy.apply_log_levels``). Sent in the client's own first
request (and at its end), one upstream that never answered ``logging/setLevel`` held every
arriving client's first call, to any upstream, for the gateway's 5 s bound on it. Here the
client is served at once; arrivals and departures while a change is being sent are worked out
together once it is done (one task, however many clients come and go).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

import anyio

from agent_gateway.downstream.sessions import DownstreamSession

logger = logging.getLogger(__name__)

Apply = Callable[[DownstreamSession | None, Iterable[DownstreamSession]], Awaitable[None]]
"""``Proxy.apply_log_levels``: the levels worked out from the clients given, and sent (bounded)."""


class LevelChanges:
    """Clients' arrivals and departures, applied upstream one change at a time."""

    def __init__(self, apply: Apply, clients: Callable[[], Iterable[DownstreamSession]]) -> None:
        """``clients``: the handshake-era clients there now, which the levels are worked out from."""
        self._apply = apply
        self._clients = clients
        self._due = anyio.Event()

    async def changed(self, session: DownstreamSession | None) -> None:
        """``session`` set its level: applied before its request is answered. None, a client
        came or went: worked out again soon, by ``running``'s task (returns at once)."""
        if session is None:
            self._due.set()
        else:
            await self._apply(session, self._clients())

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Changes applied while inside."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._work)
            yield
            tg.cancel_scope.cancel()

    async def _work(self) -> None:
        while True:
            await self._due.wait()
            self._due = anyio.Event()  # before the send: a change during it is worked out after
            try:
                await self._apply(None, self._clients())
            except Exception:  # a top-level task: the gateway serves on, the next change is sent
                logger.exception("log levels not applied upstream after clients came or went")
