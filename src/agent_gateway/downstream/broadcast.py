"""Log lines no call owns (an upstream's words outside any call of ours), sent to every
handshake-era client that may see their upstream.

Each client's lines are sent in order by a task of its own, at most ``QUEUED`` waiting; more
are dropped for a client that far behind (counted as ``notifications.dropped{why=behind}``).
Before, the lines went to the clients one after another, each allowed ``SEND_TIMEOUT``, from
the task the SDK's client starts for each notification: an upstream writing faster than its
clients read (64 KB lines as fast as a pipe takes them) held thousands of those tasks and
half a gigabyte, still being sent a minute after it stopped, and one client not reading held
each line up to 5 s for all the others.

Each line is sent to every client, so an upstream's lines cost the gateway as many sends as it
has clients: at most ``RATE`` lines a second of one upstream's are passed on (``RATE`` at
once), the rest dropped (``why=rate``). An upstream chattier than that outside any call is
writing a log, not telling its clients something.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import mcp_types as types

from agent_gateway.access import Principal
from agent_gateway.downstream.sessions import DownstreamSession, wanted
from agent_gateway.json_text import fits
from agent_gateway.runtime import TaskHost
from agent_gateway.tally import notifications_dropped
from agent_gateway.token_bucket import TokenBucket

RATE = 100
"""Lines no call owns passed on a second for one upstream, and at once."""
QUEUED = 16
"""Lines waiting for one client at most; more are dropped for it while it catches up (the
lines themselves are shared: each client's queue holds references)."""
MAX_DATA = 65_536
"""About the most characters of a line's ``data`` passed on (a string's first ones, saying how
long it was; other data left out, saying so). Each client's queue holds its lines until they
are written: whole, 20 listeners not reading held 16 lines of 4 MB each, and the gateway went
from 170 to 581 MB, and stayed there."""
Line = tuple[str, types.LoggingMessageNotificationParams]
"""An upstream's name and its line."""
Reaches = Callable[[Principal | None, str], bool]
"""Whether a client may see an upstream (a client whose policy excludes it never reads its
words)."""


class LogBroadcast(TaskHost):
    """Sends log lines no call owns to the handshake-era sessions, in order, from a task per
    session with lines to send (run it while the gateway serves)."""

    def __init__(self, sessions: Callable[[], Iterable[DownstreamSession]], reaches: Reaches) -> None:
        self._sessions = sessions
        self._reaches = reaches
        self._queues: dict[str, deque[Line]] = {}
        """The lines waiting for each session that has any (its task sends them)."""
        self._rates: dict[str, TokenBucket] = {}
        """Each upstream's lines passed on (upstreams are the config's: the table is bounded)."""

    async def send(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        """Queue ``params`` for each session that wants it; returns at once."""
        rate = self._rates.get(upstream)
        if rate is None:
            rate = self._rates[upstream] = TokenBucket(RATE, RATE)
        if rate.take() is not None:
            notifications_dropped.add(1, {"kind": "log", "why": "rate"})
            return
        params = _bounded(params)
        behind = 0
        for session in self._sessions():
            if not wanted(params.level, session.log_level) or not self._reaches(session.client, upstream):
                continue
            queue = self._queues.get(session.id)
            if queue is None:
                queue = deque()
                if not self.start_soon(self._drain, session, queue, name="log lines to a client"):
                    return  # stopping
                self._queues[session.id] = queue
            elif len(queue) >= QUEUED:
                behind += 1
                continue
            queue.append((upstream, params))
        if behind:
            notifications_dropped.add(behind, {"kind": "log", "why": "behind"})

    async def _drain(self, session: DownstreamSession, queue: deque[Line]) -> None:
        try:
            while queue:
                await session.log(*queue[0])  # bounded by SEND_TIMEOUT
                queue.popleft()
        finally:
            self._queues.pop(session.id, None)


def _bounded(params: types.LoggingMessageNotificationParams) -> types.LoggingMessageNotificationParams:
    """``params`` with its ``data`` cut to about ``MAX_DATA`` characters."""
    data = params.data
    if fits(data, MAX_DATA):
        return params
    if isinstance(data, str):
        data = f"{data[:MAX_DATA]}… ({len(data)} characters)"
    else:
        data = f"(this line's data, over {MAX_DATA} characters, left out)"
    return params.model_copy(update={"data": data})
