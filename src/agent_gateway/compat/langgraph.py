"""LangGraph checkpointers' internals the gateway uses (verified against langgraph 1.2,
langgraph-checkpoint 4.3 and langgraph-checkpoint-sqlite 3.1): neither saver can drop a
thread's older checkpoints, and nothing reads them, so the gateway drops them itself, in the
saver's own tables and maps."""

from __future__ import annotations

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

CHECKPOINT_TABLES = ("writes", "checkpoints")
"""``AsyncSqliteSaver``'s tables with a row per checkpoint (``thread_id``, ``checkpoint_ns``,
``checkpoint_id``)."""
_PRUNE = (
    "DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id < "
    "(SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '')"
)
THREADS_IN_STORE = "SELECT DISTINCT thread_id FROM checkpoints"
"""Every thread the SQLite store holds a checkpoint of."""


async def keep_latest_sqlite(saver: AsyncSqliteSaver, thread: str) -> None:
    """Delete every checkpoint of ``thread`` but its latest (call under ``saver.lock``)."""
    for table in CHECKPOINT_TABLES:
        await saver.conn.execute(_PRUNE.format(table=table), (thread, thread))
    await saver.conn.commit()


def keep_latest_in_memory(saver: InMemorySaver, thread: str) -> None:
    """The same for the in-memory store: its ``storage``, ``writes`` and ``blobs`` maps."""
    checkpoints = saver.storage[thread][""]
    if len(checkpoints) <= 1:
        return
    latest = max(checkpoints)
    stored, _, _ = checkpoints[latest]
    versions = saver.serde.loads_typed(stored)["channel_versions"]
    for old in [c for c in checkpoints if c != latest]:
        del checkpoints[old]
        saver.writes.pop((thread, "", old), None)
    for key in [k for k in saver.blobs if k[0] == thread and k[1] == "" and versions.get(k[2]) != k[3]]:
        del saver.blobs[key]
