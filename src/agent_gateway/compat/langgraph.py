"""LangGraph checkpointers' internals the gateway uses (verified against langgraph 1.2,
langgraph-checkpoint 4.3, langgraph-checkpoint-sqlite 3.1 and langgraph-checkpoint-postgres
3.2): no saver can drop a thread's older checkpoints, and nothing reads them, so the gateway
drops them itself, in the saver's own tables and maps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

if TYPE_CHECKING:
    from psycopg import AsyncConnection

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


POSTGRES_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
"""``AsyncPostgresSaver``'s tables: a row per checkpoint (``checkpoints``, ``checkpoint_writes``:
``thread_id``, ``checkpoint_ns``, ``checkpoint_id``) and per channel value (``checkpoint_blobs``:
``channel``, ``version``, named by the ``channel_versions`` of a checkpoint's JSONB)."""
_LATEST_PG = "(SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = %(t)s AND checkpoint_ns = '')"
_PRUNE_PG = (
    f"DELETE FROM checkpoint_writes WHERE thread_id = %(t)s AND checkpoint_ns = '' AND checkpoint_id < {_LATEST_PG}",
    f"DELETE FROM checkpoints WHERE thread_id = %(t)s AND checkpoint_ns = '' AND checkpoint_id < {_LATEST_PG}",
    "DELETE FROM checkpoint_blobs b WHERE b.thread_id = %(t)s AND b.checkpoint_ns = '' AND NOT EXISTS "
    "(SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = '' "
    "AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)",
)


async def keep_latest_postgres(conn: AsyncConnection[Any], thread: str) -> None:
    """The same in Postgres, in one transaction (blobs no kept checkpoint names go too)."""
    async with conn.transaction():
        for statement in _PRUNE_PG:
            await conn.execute(statement, {"t": thread})
