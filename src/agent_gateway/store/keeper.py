"""The session records this replica is the one to write again, when the store has lost them.

The store loses a record while the replica that serves its session lives on in three ways:
the session was opened while Redis could not be reached (its record was never written), Redis
restarted without persistence or was flushed (every record gone), or it evicted the key. Any
of them left the session served by that replica only (another answered "Session not found")
and missing from its client's count across replicas, for as long as it lived.

So the replica writes the records of the sessions it holds again (``SessionRecords.restore``):
all of them when the store answers again after an outage, or when its *epoch* (a key the store
keeps until it loses its data) changed; one of them when a request (``store/limits.py``) or an
open notification stream (``compat/adoption.py``) finds its record gone. A session deleted
meanwhile (its tombstone) is not brought back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import anyio
from anyio.abc import TaskStatus
from opentelemetry import metrics, trace

from agent_gateway.store.client import SharedStore
from agent_gateway.store.sessions import SessionRecord, SessionRecords
from agent_gateway.telemetry import SCOPE

logger = logging.getLogger(__name__)
_tracer = trace.get_tracer(SCOPE)

_LOOK_EVERY = 2.0
"""Seconds between two looks at the store's epoch and outages."""
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
        restored.add(0)  # a series from the start: a dashboard shows 0, not "no data"

    def keep(self, held: Held) -> None:
        """Keep the records of the sessions ``held`` names (set once, before ``run``)."""
        self._held = held

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: write every held record again when the store may have lost them."""
        seen = (self._store.outages, await self._records.epoch())  # before any session is held
        task_status.started()
        while True:
            await anyio.sleep(_LOOK_EVERY)
            if not self._store.available:
                continue
            outages = self._store.outages  # read first: an outage during the look counts next time
            epoch = await self._records.epoch()
            if epoch is None:
                continue
            if (outages, epoch) != seen:
                why = "it answers again" if outages != seen[0] else "it lost its data"
                if await self._restore(self._all(), why):
                    seen = (outages, epoch)

    async def lost(self, session_id: str) -> None:
        """``session_id``'s record was found gone: write it again if this replica serves it."""
        record = self._held.record(session_id) if self._held is not None else None
        if record is not None:
            await self._restore([record], "its record was gone")

    def _all(self) -> list[SessionRecord]:
        return list(self._held.records()) if self._held is not None else []

    async def _restore(self, records: list[SessionRecord], why: str) -> bool:
        """Write ``records`` again where the store lacks them; False: it did not answer."""
        written = deleted = 0
        with _tracer.start_as_current_span("store.sessions.restore") as span:
            span.set_attribute("agent_gateway.sessions.held", len(records))
            for start in range(0, len(records), _BATCH):
                answers = await self._records.restore(records[start : start + _BATCH])
                if answers is None:
                    return False
                written += answers.count(1)
                deleted += answers.count(-1)
            span.set_attribute("agent_gateway.sessions.restored", written)
        if written:
            restored.add(written)
            logger.warning(
                "shared store: %d session record(s) it no longer held written again (%s)", written, why
            )
        if deleted:
            logger.info("shared store: %d session(s) held here were deleted elsewhere: not restored", deleted)
        return True
