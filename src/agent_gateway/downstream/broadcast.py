"""Log lines no call owns (an upstream's words outside any call of ours), sent to every
handshake-era client that may see their upstream.

Each client's copy is sent in a task of its own, and a client still taking the previous line
is skipped for this one (counted as ``notifications.dropped{why=behind}``). Before, the lines
went to the clients one after another, each allowed ``SEND_TIMEOUT``, from the task the SDK's
client starts for each notification: one client not reading its stream held every line 5 s,
and an upstream writing faster than its slowest client read (64 KB lines as fast as a pipe
takes them) held thousands of those tasks and half a gigabyte, still being sent a minute
after it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import mcp_types as types

from agent_gateway.access import Principal
from agent_gateway.downstream.sessions import DownstreamSession, wanted
from agent_gateway.runtime import TaskHost
from agent_gateway.tally import notifications_dropped

Reaches = Callable[[Principal | None, str], bool]
"""Whether a client may see an upstream (a client whose policy excludes it never reads its
words)."""


class LogBroadcast(TaskHost):
    """Sends log lines no call owns to the handshake-era sessions, at most one at a time per
    session, in tasks of its own (run it while the gateway serves)."""

    def __init__(self, sessions: Callable[[], Iterable[DownstreamSession]], reaches: Reaches) -> None:
        self._sessions = sessions
        self._reaches = reaches
        self._sending: set[str] = set()
        """The sessions a line is being sent to now."""

    async def send(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        """Start sending ``params`` to each session that wants it; returns at once."""
        behind = 0
        for session in self._sessions():
            if not wanted(params.level, session.log_level) or not self._reaches(session.client, upstream):
                continue
            if session.id in self._sending:
                behind += 1
                continue
            if not self.start_soon(self._send, session, upstream, params, name="log line to a client"):
                return  # stopping
            self._sending.add(session.id)
        if behind:
            notifications_dropped.add(behind, {"kind": "log", "why": "behind"})

    async def _send(
        self, session: DownstreamSession, upstream: str, params: types.LoggingMessageNotificationParams
    ) -> None:
        try:
            await session.log(upstream, params)  # bounded by SEND_TIMEOUT
        finally:
            self._sending.discard(session.id)
