"""Room for a new session: at its client's ``max_sessions``, and at this replica's
``server.max_sessions``, an idle session ends to make way for it.

At the client's cap. A client that opens sessions and never says DELETE (many do not: they
reconnect, each time a new session) locked itself out for the idle timeout (30 min) once it
reached its cap; and every anonymous client on one address is one client (the README's
example, on loopback: every local IDE and agent), so one of them holding the address's 100
sessions shut the others out. Now the client's session idle the longest ends, as its idle
timeout would have ended it, and the new one is served.

At the replica's bound. Anonymous clients are told apart by address, and a local process may
use any of loopback's 16 million: 100 addresses holding 100 sessions each filled the SDK's
10,000 (9.5 GB, at 58 KB of ``initialize`` each), and every new session was refused for the
idle timeout. Now the replica holds ``server.max_sessions``; at the bound, the session idle the
longest among those of the clients holding the most (more than the newcomer does) ends;
failing one idle, of the clients holding the next most, and so on; then the newcomer's own.
With none idle, a client holding two more than the newcomer gives up its oldest session that
only listens (its notification stream open, no request in flight; its client reconnects), as
``listeners.py`` does for listen streams: holding streams open does not keep the bound full.
So the clients filling the bound are the ones that give way, a client holding fewer is never
made to, and a session with a request in flight never ends.

With a shared store a client's sessions are counted across replicas, and one idle here may be
served by another: the one no replica serves is found by asking them (``store/room.py``).

Only when none of these is found is the new one refused. Each ending is counted
(``session_made_way``) and logged at INFO.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from agent_gateway.access import Principal
from agent_gateway.compat import idle
from agent_gateway.opening import Openings
from agent_gateway.refusals import refused

if TYPE_CHECKING:
    from agent_gateway.store.room import SharedRoom


class Held(Protocol):
    """A session as room is made: a ``downstream.sessions.DownstreamSession`` (named by what
    is read of it: that module is beneath admission, which asks here)."""

    @property
    def id(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def client(self) -> Principal | None: ...
    @property
    def started(self) -> float: ...
    @property
    def waiting(self) -> int: ...


class Room:
    """Makes room among one gateway's sessions, once its HTTP app has started (``manager``)."""

    def __init__(
        self, sessions: Callable[[], Iterable[Held]], max_sessions: int, shared: SharedRoom | None = None
    ) -> None:
        self._sessions = sessions
        """The handshake-era sessions held now (``SessionRegistry.handshake_sessions``)."""
        self.max_sessions = max_sessions
        """This replica's bound of handshake-era HTTP sessions (``server.max_sessions``)."""
        self.openings = Openings()
        self.manager: object | None = None
        """The session manager serving the sessions (None until the app has started)."""
        self._shared = shared
        """Room across replicas (``store:``), where clients' sessions are counted."""
        if shared is not None:
            shared.serving = self.serving

    def make(self, client: Principal) -> bool:
        """Whether a session of ``client``'s, idle, was ended to make room for its next."""
        own = [s for s in self._http_sessions() if s.client is client and not s.waiting]
        ended = self._end_longest_idle([own])
        if ended is not None:
            self._made_way(
                ended.id, client, f"its max_sessions {client.policy.max_sessions}", "idle the longest"
            )
        return ended is not None

    async def make_shared(self, client: Principal) -> bool:
        """Whether a session of ``client``'s that no replica serves was ended to make room for
        its next, at its ``max_sessions`` counted across replicas (``store/room.py``)."""
        if self._shared is None:
            return False
        ended = await self._shared.make(client)
        if ended is None:
            return False
        if self.manager is not None:  # at once: its end's announcement drops it here too, later
            idle.end(self.manager, ended)
        bound = f"its max_sessions {client.policy.max_sessions} across replicas"
        self._made_way(ended, client, bound, "touched the longest ago, served by no replica")
        return True

    def serving(self, session_ids: Sequence[str]) -> list[str]:
        """Which of ``session_ids`` this replica serves now: a request in flight, its stream
        open, or a question to its client unanswered."""
        if self.manager is None:
            return []
        asking = {s.id for s in self._http_sessions() if s.waiting}
        return [*idle.serving(self.manager, session_ids), *(s for s in session_ids if s in asking)]

    def has_room(self) -> bool:
        """Whether this replica holds fewer sessions than its bound (none ended to make room)."""
        if self.manager is None:
            return True
        opening = self.openings.count
        # Counted in one lookup while below the bound (the count is an upper bound: sessions
        # being ended are in it); counted exactly once near it.
        if idle.held(self.manager) + opening < self.max_sessions:
            return True
        return idle.live(self.manager) + opening < self.max_sessions

    def admit(self, client: Principal) -> bool:
        """Whether a new session of ``client``'s fits this replica's bound, room made for it
        when it is reached; False: every session that could give way is busy."""
        if self.has_room():
            return True
        tiers = self._may_give_way(client)
        ended, why = self._end_longest_idle(tiers), "idle the longest"
        if ended is None:
            ended, why = self._end_oldest_listening(client, tiers[:-1]), "the oldest only listening"
        if ended is None:
            refused(
                "sessions_all",
                "refused a new session of %s: this replica holds its %d sessions, none to give way",
                client.label,
                self.max_sessions,
                peer=client.label,
            )
            return False
        holder = ended.client.label if ended.client is not None else "?"
        self._made_way(ended.id, client, f"server.max_sessions {self.max_sessions}", why, holder)
        return True

    def _may_give_way(self, client: Principal) -> list[list[Held]]:
        """The sessions that may end for a new one of ``client``'s, in the order they give
        way: those of the clients holding more than it does, the most first; then its own.
        Not one with a question of the gateway's to its client unanswered (``waiting``)."""
        tiers: dict[int, list[Held]] = {}
        own: list[Held] = []
        mine = _holding(client)
        for session in self._http_sessions():
            holder = session.client
            if session.waiting:
                continue
            if holder is client:
                own.append(session)
            elif holder is not None and (count := _holding(holder)) > mine:
                tiers.setdefault(count, []).append(session)
        return [tiers[count] for count in sorted(tiers, reverse=True)] + [own]

    def _end_longest_idle(self, tiers: list[list[Held]]) -> Held | None:
        """End the session idle the longest in the first of ``tiers`` with one idle; None
        when none is."""
        if self.manager is None:
            return None
        for tier in tiers:
            deadlines = idle.idle(self.manager, (s.id for s in tier))
            if deadlines:
                longest = min(deadlines, key=deadlines.__getitem__)
                idle.end(self.manager, longest)
                return next(s for s in tier if s.id == longest)
        return None

    def _end_oldest_listening(self, client: Principal, tiers: list[list[Held]]) -> Held | None:
        """End the oldest session that only listens (its stream open, no request in flight)
        of the client holding the most, when it holds two more than ``client`` (so the two do
        not take each other's in turn); None when there is none."""
        if self.manager is None:
            return None
        for tier in tiers:
            holder = tier[0].client
            if holder is None or _holding(holder) < _holding(client) + 2:
                return None  # the tiers hold fewer and fewer
            listening = set(idle.listening(self.manager, (s.id for s in tier)))
            if listening:
                oldest = min((s for s in tier if s.id in listening), key=lambda s: s.started)
                idle.end(self.manager, oldest.id)
                return oldest
        return None

    def _http_sessions(self) -> list[Held]:
        return [s for s in self._sessions() if s.transport == "http"]

    def _made_way(
        self, ended: str, client: Principal, bound: str, why: str, holder: str | None = None
    ) -> None:
        """Count and log an ending (``holder``: the ended session's client, when not ``client``)."""
        refused(
            "session_made_way",
            "ended session %s of %s, %s, to make way for a new one of %s (%s)",
            ended,
            holder or client.label,
            why,
            client.label,
            bound,
            level=logging.INFO,
        )


def _holding(client: Principal) -> int:
    """The sessions ``client`` holds, those it is opening now included (else a client opening
    many at once ranked as holding none, and each ended a bystander's)."""
    return client.sessions + client.opening
