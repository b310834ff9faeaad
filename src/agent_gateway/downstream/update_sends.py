"""Resource updates sent to handshake-era sessions on their notification streams.

Each session's updates are sent in order by a task of its own, at most ``QUEUED`` waiting;
more are dropped for a session that far behind (counted as
``notifications.dropped{kind=resource_updated,why=behind}``). Before, one task per upstream
session relayed its updates to each subscriber in turn, each send allowed ``SEND_TIMEOUT``:
a client that did not read its notification stream, once the stream was full, held every
update of that upstream session 5 s, for every client subscribed through it, and those
behind were dropped (a bystander's update never came in 60 s; 0.02 s alone). An update only
says "read it again": a client that far behind loses nothing it could not read.
"""

from __future__ import annotations

from collections import deque

import anyio

from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.runtime import SEND_TIMEOUT, TaskHost
from agent_gateway.tally import notifications_dropped

QUEUED = 64
"""Updates waiting for one session at most (each a URI: 8 KiB at most, so 512 KiB)."""


class UpdateSends(TaskHost):
    """Sends resource updates to handshake-era sessions, from a task per session with updates
    to send (run it while the gateway serves)."""

    def __init__(self) -> None:
        self._queues: dict[DownstreamSession, deque[str]] = {}
        """The public URIs waiting for each session that has any (its task sends them)."""

    def send(self, session: DownstreamSession, uri: str) -> None:
        """Queue ``uri``'s update for ``session``; returns at once."""
        queue = self._queues.get(session)
        if queue is None:
            queue = deque[str]()
            if not self.start_soon(self._drain, session, queue, name="resource updates to a client"):
                return  # stopping
            self._queues[session] = queue
        elif len(queue) >= QUEUED:
            notifications_dropped.add(1, {"kind": "resource_updated", "why": "behind"})
            return
        queue.append(uri)

    async def _drain(self, session: DownstreamSession, queue: deque[str]) -> None:
        try:
            while queue:
                if (connection := session.connection) is not None:
                    with anyio.move_on_after(SEND_TIMEOUT):
                        await connection.send_resource_updated(queue[0])
                queue.popleft()
        finally:
            self._queues.pop(session, None)
