"""Conversation memory in Postgres, shared by every replica: LangGraph's own checkpointer on a
psycopg connection pool, plus the gateway's table of when each thread was last used.

Replicas start together against an empty database (a rollout, ``compose up``): LangGraph's
``setup()`` and the gateway's table are created under the gateway's set-up lock
(``postgres.set_up``).
"""

from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack

import anyio
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection, InterfaceError, OperationalError
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from agent_gateway.compat.langgraph import keep_latest_postgres
from agent_gateway.errors import StoreUnavailable
from agent_gateway.postgres import set_up
from agent_gateway.shown_urls import without_password

logger = logging.getLogger(__name__)

_POOL_SIZE = 10
_POOL_WAIT = 5.0
_WATCH_EVERY = 2.0
_CHECK_BOUND = 2.0
_THREADS = (
    "CREATE TABLE IF NOT EXISTS agent_gateway_threads "
    "(thread_id TEXT PRIMARY KEY, used_at DOUBLE PRECISION NOT NULL)"
)
_ADOPT = (
    "INSERT INTO agent_gateway_threads (thread_id, used_at) SELECT DISTINCT thread_id, %s FROM checkpoints "
    "ON CONFLICT (thread_id) DO NOTHING"
)
# Whose each thread is, for the bound on threads per client (threads from before: no one's).
_OWNERS = (
    "ALTER TABLE agent_gateway_threads ADD COLUMN IF NOT EXISTS owner TEXT",
    "CREATE INDEX IF NOT EXISTS agent_gateway_threads_owner ON agent_gateway_threads (owner, used_at)",
)
_USED = (
    "INSERT INTO agent_gateway_threads (thread_id, used_at, owner) VALUES (%s, %s, %s) "
    "ON CONFLICT (thread_id) DO UPDATE SET used_at = GREATEST(agent_gateway_threads.used_at, excluded.used_at), "
    "owner = COALESCE(agent_gateway_threads.owner, excluded.owner)"
)
_CROWDED = "SELECT thread_id FROM agent_gateway_threads WHERE owner = %s ORDER BY used_at DESC OFFSET %s"
_EXPIRED = "SELECT thread_id FROM agent_gateway_threads WHERE used_at < %s"
_USED_AT = "SELECT used_at FROM agent_gateway_threads WHERE thread_id = %s"
_FORGET = "DELETE FROM agent_gateway_threads WHERE thread_id = %s"

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
_LOST = (OperationalError, InterfaceError)
"""The driver's errors that say the database is gone (the pool's timeout is an
``OperationalError``), not that a query was wrong."""


async def open_postgres(url: str, stack: AsyncExitStack) -> AsyncPostgresSaver:
    """LangGraph's Postgres checkpointer on a pool closed with ``stack``, its schema ready.

    Raises:
        StoreUnavailable: the database cannot be reached, or its schema cannot be made.
    """
    try:  # one connection first: its error names the reason (the pool's only says it timed out)
        probe = await AsyncConnection.connect(url, connect_timeout=int(_CHECK_BOUND * 2))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreUnavailable(
            f"conversation memory {without_password(url)}: cannot reach Postgres: {reason}"
        ) from exc
    await probe.close()
    pool: Pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=_POOL_SIZE,
        timeout=_POOL_WAIT,  # a run waits this long for a connection, then fails with the reason
        open=False,
        # What LangGraph's saver needs of each connection (its own from_conn_string sets them).
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    try:
        await pool.open(wait=True, timeout=10.0)
    except Exception as exc:  # psycopg's PoolTimeout and OperationalError alike
        await pool.close()
        raise StoreUnavailable(
            f"conversation memory {without_password(url)}: cannot reach Postgres: {exc}"
        ) from exc
    stack.push_async_callback(pool.close)
    saver = AsyncPostgresSaver(conn=pool)  # pyright: ignore[reportArgumentType]  # a pool of dict-row connections
    try:
        await _set_up(pool, saver)
    except Exception as exc:
        raise StoreUnavailable(
            f"conversation memory {without_password(url)}: cannot create its tables: {exc}"
        ) from exc
    logger.info("conversation memory: %s", without_password(url))
    return saver


async def _set_up(pool: Pool, saver: AsyncPostgresSaver) -> None:
    async def make() -> None:
        await saver.setup()
        await conn.execute(_THREADS)
        for statement in _OWNERS:
            await conn.execute(statement)
        await conn.execute(_ADOPT, (time.time(),))

    async with pool.connection() as conn:
        await set_up(conn, make)


class PostgresThreads:
    """When each thread was last used, and compaction, in the shared database; and whether
    the database answers (``watch``)."""

    def __init__(self, saver: AsyncPostgresSaver, url: str) -> None:
        self._pool: Pool = saver.conn  # pyright: ignore[reportAttributeAccessIssue]
        self._saver = saver
        self._where = without_password(url)
        self.problem: str | None = None
        """Why the database does not answer now, or None while it does."""

    async def watch(self) -> None:
        """Ask the database every few seconds; log and report when it stops and starts answering."""
        reported: str | None = None  # its own finding: a run may have set ``problem`` since
        while True:
            problem = await self._check()
            if problem is not None and reported is None:
                logger.error("conversation memory %s unavailable: %s", self._where, problem)
            elif problem is None and reported is not None:
                logger.warning("conversation memory %s answers again", self._where)
            self.problem = reported = problem
            await anyio.sleep(_WATCH_EVERY)

    def lost(self, exc: BaseException) -> str | None:
        """Why ``exc`` says the database is gone, or None (another error: a bug, told as one).

        The database is then taken as down (``problem``) until the watch's next check: other
        runs fail at once with why, not each after waiting out the pool."""
        if not isinstance(exc, _LOST):
            return None
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        why = f"conversation memory (Postgres) is unavailable: {reason}"
        self.problem = self.problem or why
        return why

    async def _check(self) -> str | None:
        try:
            with anyio.fail_after(_CHECK_BOUND):
                async with self._pool.connection(timeout=_CHECK_BOUND) as conn:
                    await conn.execute("SELECT 1")
        except Exception as exc:  # psycopg's errors and the pool's timeout alike
            return f"conversation memory (Postgres) does not answer: {str(exc) or type(exc).__name__}"
        return None

    async def used(self, thread: str, at: float, owner: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(_USED, (thread, at, owner))

    async def compact(self, thread: str) -> None:
        async with self._pool.connection() as conn:
            await keep_latest_postgres(conn, thread)

    async def expired(self, cutoff: float) -> list[str]:
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(_EXPIRED, (cutoff,))).fetchall()
        return [str(row["thread_id"]) for row in rows]

    async def crowded(self, owner: str, kept: int) -> list[str]:
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(_CROWDED, (owner, kept))).fetchall()
        return [str(row["thread_id"]) for row in rows]

    async def used_at(self, thread: str) -> float | None:
        async with self._pool.connection() as conn:
            row = await (await conn.execute(_USED_AT, (thread,))).fetchone()
        return None if row is None else float(row["used_at"])

    async def forget(self, thread: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(_FORGET, (thread,))
