"""Room for a client's next session at its ``max_sessions``: its session idle the longest ends.

Without, a client that opens sessions and never says DELETE (many do not: they reconnect,
each time a new session) locked itself out for the idle timeout (30 min) once it reached its
cap; and every anonymous client on one address is one client (the README's example, on
loopback: every local IDE and agent), so one of them holding the address's 100 sessions shut
the others out. Now the client's session idle the longest ends, as its idle timeout would
have ended it, and the new one is served; only when every one of its sessions has a
request or its notification stream open is it refused. Counted (``session_made_way``) and
logged at INFO.
"""

from __future__ import annotations

import logging

from agent_gateway.access import Principal
from agent_gateway.compat.idle import end_longest_idle
from agent_gateway.downstream.sessions import SessionRegistry
from agent_gateway.refusals import refused


class Room:
    """Makes room among one gateway's sessions, once its HTTP app has started (``manager``)."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions
        self.manager: object | None = None
        """The session manager serving the sessions (None until the app has started)."""

    def make(self, client: Principal) -> bool:
        """Whether a session of ``client``'s, idle, was ended to make room for its next."""
        if self.manager is None:
            return False
        own = [
            s.id for s in self._sessions.handshake_sessions() if s.client is client and s.transport == "http"
        ]
        ended = end_longest_idle(self.manager, own)
        if ended is None:
            return False
        refused(
            "session_made_way",
            "ended session %s of %s, idle the longest, to make way for its next (max_sessions %d)",
            ended,
            client.label,
            client.policy.max_sessions,
            level=logging.INFO,
        )
        return True
