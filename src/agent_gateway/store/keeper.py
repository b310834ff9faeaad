"""The session records this replica is the one to write again, when the store has lost them.

The store loses a record while the replica that serves its session lives on in three ways:
the session was opened while Redis could not be reached (its record was never written), Redis
restarted without persistence or was flushed (every record gone), or it evicted the key. Any
of them left the session served by that replica only (another answered "Session not found")
and missing from its client's count across replicas, for as long as it lived.

So the replica writes the records of the sessions it holds again (``SessionRecords.restore``):
all of them when the store answers again after an outage, or when its *epoch* (a key the store
keeps until it loses its data) changed; one of them when a request (``store/limits.py``) finds
its record gone, or an open notification stream (``compat/adoption.py``) its record or its
place in its client's count (a request counts it again itself); then the other replicas serving it add what they hold of it (the
subscriptions they hold, their dedicated upstream sessions). A session deleted meanwhile is
not brought back: its tombstone says so (and the replica drops it), and a replica that served
a DELETE while the store could not be told tells it before writing anything again (so too
the record fields it set or dropped meanwhile: a log level, a subscription let go).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import anyio
from anyio.abc import TaskStatus
from opentelemetry import metrics, trace

from agent_gateway.runtime import CLEANUP_TIMEOUT
from agent_gateway.store.sessions import SessionRecord, SessionRecords
from agent_gateway.telemetry import SCOPE

if TYPE_CHECKING:
    from agent_gateway.store.client import SharedStore

logger = logging.getLogger(__name__)

Ended = Callable[[str], Awaitable[None]]
_tracer = trace.get_tracer(SCOPE)

_LOOK_EVERY = 2.0
"""Seconds between two looks at the store's epoch and outages."""
_BACKOFF_MAX = 30.0
"""Seconds between two tries at most, while writing the records again fails."""
_BATCH = 500
"""Records written again in one round trip."""
restored = metrics.get_meter("agent-gateway").create_counter(
    "agent_gateway.store.sessions_restored",
    description="Session records the shared store had lost, written again by the replica serving them.",
)


class Held(Protocol):
    """The sessions this replica serves, as their records would be written now."""

    def record(self, session_id: str) -> SessionRecord | None: ...

    def records(self) -> Iterable[SessionRecord]: ...


class SessionKeeper:
    """Writes again what the store lost of the sessions this replica serves."""

    def __init__(self, store: SharedStore, records: SessionRecords) -> None:
        self._store = store
        self._records = records
        self._held: Held | None = None
        self._drop: Ended | None = None
        restored.add(0)  # a series from the start: a dashboard shows 0, not "no data"

    def keep(self, held: Held) -> None:
        """Keep the records of the sessions ``held`` names (set once, before ``run``)."""
        self._held = held

    def drop_with(self, drop: Ended) -> None:
        """Drop a held session with ``drop`` when the store says it was deleted elsewhere."""
        self._drop = drop

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: write every held record again when the store may have lost them."""
        seen = (self._store.outages, await self._records.epoch())  # before any session is held
        task_status.started()
        wait = _LOOK_EVERY
        while True:
            await anyio.sleep(wait)
            if not self._store.available:
                continue
            outages = self._store.outages  # read first: an outage during the look counts next time
            epoch = await self._records.epoch()
            if epoch is None or (outages, epoch) == seen:
                continue
            why = "it answers again" if outages != seen[0] else "it lost its data"
            # What it missed first: else a session deleted meanwhile came back, or a record
            # written again kept a level or a subscription older than the replica's own.
            if await self._records.say_unsaid() and await self._restore(self._all(), why):
                seen, wait = (outages, epoch), _LOOK_EVERY
            else:  # it fails again: the next try later, each time (a store out of memory)
                wait = min(wait * 2, _BACKOFF_MAX)

    async def lost(self, session_id: str) -> None:
        """The store lost ``session_id``'s record, or its place in its client's count: write
        them again if this replica serves it (and tell the others serving it to add theirs)."""
        if (record := self._record(session_id)) is not None:
            await self._restore([record], "its record was gone", announce=True)

    async def restored_elsewhere(self, session_id: str) -> None:
        """Another replica wrote ``session_id``'s record again: add what this one holds of it."""
        if (record := self._record(session_id)) is not None:
            await self._restore([record], "written again elsewhere")

    def _record(self, session_id: str) -> SessionRecord | None:
        return self._held.record(session_id) if self._held is not None else None

    def _all(self) -> list[SessionRecord]:
        return list(self._held.records()) if self._held is not None else []

    async def _restore(self, records: list[SessionRecord], why: str, *, announce: bool = False) -> bool:
        """Write ``records`` again where the store lacks them; False: it did not answer."""
        written: list[str] = []
        deleted: list[str] = []
        with _tracer.start_as_current_span("store.sessions.restore") as span:
            span.set_attribute("agent_gateway.sessions.held", len(records))
            for start in range(0, len(records), _BATCH):
                batch = records[start : start + _BATCH]
                answers = await self._records.restore(batch, announce=announce)
                if answers is None:
                    return False
                written += [r.id for r, a in zip(batch, answers, strict=True) if a == 1]
                deleted += [r.id for r, a in zip(batch, answers, strict=True) if a == -1]
            span.set_attribute("agent_gateway.sessions.restored", len(written))
        if written:
            restored.add(len(written))
            logger.warning(
                "shared store: %d session record(s) it no longer held written again (%s)", len(written), why
            )
        for session_id in deleted:  # its end was announced while this replica was not listening
            logger.info("session %s was deleted through another replica: dropped here", session_id[:64])
            if self._drop is not None:
                with anyio.move_on_after(CLEANUP_TIMEOUT):  # as the announcement's handler is
                    await self._drop(session_id)
        return True
