"""What the gateway's tables in a shared Postgres have in common: schema made under one
advisory lock, so replicas started together against an empty database make it once.

The lock is taken with ``pg_try_advisory_lock`` in a loop rather than a blocking
``pg_advisory_lock``, because a backend blocked on the lock holds a snapshot, and LangGraph's
``CREATE INDEX CONCURRENTLY`` waits for every such snapshot: the two would wait on each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from psycopg import AsyncConnection

SETUP_LOCK = 0x61677731  # "agw1": the key of the advisory lock schema changes are made under
SETUP_BOUND = 120.0


async def set_up(conn: AsyncConnection[Any], make: Callable[[], Awaitable[None]]) -> None:
    """Run ``make`` (schema changes) on ``conn`` while holding the set-up lock (raises
    ``TimeoutError`` after ``SETUP_BOUND`` seconds of another replica holding it)."""
    with anyio.fail_after(SETUP_BOUND):
        # Polled: another replica's set-up holds it (no event crosses processes).
        while not await _try_lock(conn):  # noqa: ASYNC110
            await anyio.sleep(0.05)
    try:
        await make()
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))


async def _try_lock(conn: AsyncConnection[Any]) -> bool:
    row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (SETUP_LOCK,))).fetchone()
    return bool(row and _first(row))


def _first(row: Any) -> Any:
    return next(iter(row.values())) if isinstance(row, dict) else row[0]  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
