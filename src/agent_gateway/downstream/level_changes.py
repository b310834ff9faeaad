"""The log levels of the shared upstream sessions worked out again when a handshake-era
client comes or goes, in a task of the gateway's own.

A client arriving or leaving asks nothing of any upstream, but may change the level a shared
upstream session should run at (``Proxy.apply_log_levels``). Sent in the client's own first
request (and at its end), one upstream that never answered ``logging/setLevel`` held every
arriving client's first call, to any upstream, for the gateway's 5 s bound on it. Here the
client is served at once; arrivals and departures while a change is being sent are worked out
together once it is done (one task, however many clients come and go). So are levels set
through another replica (``hears``): applied in the replicas' channel, whose messages are
handled one at a time, one upstream holding its answer held every later message for 5 s a
level set (a session ended elsewhere, a catalog change, a held call's keepalive, 6 s without
which gives the call up: two levels set in a row would pass it).
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
SetElsewhere = Callable[[str, str], Awaitable[None]]
"""A session's level (its id, the level) set through another replica, applied here."""


class LevelChanges:
    """Clients' arrivals and departures, applied upstream one change at a time."""

    def __init__(self, apply: Apply, clients: Callable[[], Iterable[DownstreamSession]]) -> None:
        """``clients``: the handshake-era clients there now, which the levels are worked out from."""
        self._apply = apply
        self._clients = clients
        self._due = anyio.Event()
        self._elsewhere: dict[str, str] = {}
        """Levels set through other replicas since the last change applied (the last one counts)."""
        self._set_elsewhere: SetElsewhere | None = None

    async def changed(self, session: DownstreamSession | None) -> None:
        """``session`` set its level: applied before its request is answered. None, a client
        came or went: worked out again soon, by ``running``'s task (returns at once)."""
        if session is None:
            self._due.set()
        else:
            await self._apply(session, self._clients())

    def hears(self, set_elsewhere: SetElsewhere) -> SetElsewhere:
        """``set_elsewhere`` as the replicas' channel calls it: the level noted, applied (by
        ``set_elsewhere``) in ``running``'s task; the channel's next message is read at once."""
        self._set_elsewhere = set_elsewhere
        return self._heard

    async def _heard(self, session_id: str, level: str) -> None:
        self._elsewhere[session_id] = level
        self._due.set()

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
            elsewhere, self._elsewhere = self._elsewhere, {}
            for session_id, level in elsewhere.items():
                if self._set_elsewhere is not None:
                    await self._step(self._set_elsewhere(session_id, level))
            await self._step(self._apply(None, self._clients()))

    @staticmethod
    async def _step(change: Awaitable[None]) -> None:
        try:
            await change
        except Exception:  # a top-level task: the gateway serves on, the next change is sent
            logger.exception("log levels not applied upstream")
