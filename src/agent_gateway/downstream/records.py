"""The records of the sessions this replica serves, as the shared store should hold them now
(log level, dedicated upstream sessions, the resource subscriptions held here): what
``store/keeper.py`` writes again when the store lost them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

from agent_gateway.downstream.sessions import DownstreamSession, SessionRegistry
from agent_gateway.store.record import SessionRecord, UpstreamRecord


class HeldRecords:
    """The ``Held`` of ``store/keeper.py``: each live handshake-era session with a record, as
    it is now (not as first written)."""

    def __init__(
        self,
        registry: SessionRegistry,
        upstreams: Callable[[str], Mapping[str, UpstreamRecord]],
        subscriptions: Callable[[DownstreamSession], Iterable[str]],
        replica: str,
    ) -> None:
        """``upstreams``: a session's dedicated upstream sessions by upstream (its id);
        ``subscriptions``: the URIs it is subscribed to on ``replica``, this one."""
        self._registry = registry
        self._upstreams = upstreams
        self._subscriptions = subscriptions
        self._replica = replica

    def record(self, session_id: str) -> SessionRecord | None:
        session = self._registry.live.get(session_id)
        return self._now(session) if session is not None else None

    def records(self) -> Iterator[SessionRecord]:
        for session in list(self._registry.live.values()):
            if (record := self._now(session)) is not None:
                yield record

    def _now(self, session: DownstreamSession) -> SessionRecord | None:
        if session.record is None:
            return None
        return replace(
            session.record,
            level=session.log_level,
            upstreams=self._upstreams(session.id),
            subscriptions=dict.fromkeys(self._subscriptions(session), self._replica),
        )
