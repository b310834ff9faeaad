"""Tool pins in the shared Postgres (``agent.memory.store: postgres``), so that every replica
withholds the same changed tools and ``agent-gateway pins accept`` is said once for all.

Each replica keeps working on its own copy (``Pins``' table in memory, read synchronously
when an upstream's part of the catalog is built, never per call): loaded from the database at
start-up and on a reload, and each change it makes written through, in order, by one writer
task. The first replica to pin a tool wins (``ON CONFLICT DO NOTHING``): two replicas that
see a new tool at the same moment pin the same definition, unless the upstream changed it in
between, and then the other replica's copy follows the database at its next reload.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, LiteralString

import anyio
import psycopg
from psycopg import AsyncConnection

from agent_gateway.errors import StoreUnavailable
from agent_gateway.postgres import set_up
from agent_gateway.shown_urls import without_password

logger = logging.getLogger(__name__)

_CREATE = """
CREATE TABLE IF NOT EXISTS agent_gateway_pins (
    source TEXT NOT NULL,
    name TEXT NOT NULL,
    upstream TEXT NOT NULL,
    digest TEXT NOT NULL,
    definition TEXT NOT NULL,
    first_seen DOUBLE PRECISION NOT NULL,
    pending_digest TEXT,
    pending_definition TEXT,
    changed TEXT,
    PRIMARY KEY (source, name)
)
"""
Change = Literal["pin", "flag", "clear"]
_WRITES: dict[Change, LiteralString] = {
    # (source, name, upstream, digest, definition, first_seen)
    "pin": "INSERT INTO agent_gateway_pins (source, name, upstream, digest, definition, first_seen) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (source, name) DO NOTHING",
    # (digest, definition, changed, source, name)
    "flag": "UPDATE agent_gateway_pins SET pending_digest = %s, pending_definition = %s, changed = %s "
    "WHERE source = %s AND name = %s",
    # (source, name)
    "clear": "UPDATE agent_gateway_pins SET pending_digest = NULL, pending_definition = NULL, changed = NULL "
    "WHERE source = %s AND name = %s",
}
_ACCEPT = (
    "UPDATE agent_gateway_pins SET digest = pending_digest, definition = pending_definition, "
    "pending_digest = NULL, pending_definition = NULL, changed = NULL "
    "WHERE pending_digest IS NOT NULL AND (%s OR name = ANY(%s)) RETURNING name"
)
_LIST = "SELECT name, upstream, first_seen, changed FROM agent_gateway_pins ORDER BY upstream, name"
_ROWS = (
    "SELECT source, name, upstream, digest, definition, first_seen, pending_digest, pending_definition, "
    "changed FROM agent_gateway_pins"
)

_CONNECT_BOUND = 5
_ANSWER_BOUND = 10.0
"""Seconds a statement may wait for its answer: a database that holds the connection open and
answers nothing (a partition, a frozen host) held a reload's read of the pins for ever."""
_RETRY = 1.0
_FLUSH_BOUND = 5.0


class SharedPins:
    """The pins table in Postgres, and the writer that keeps it in step with this replica."""

    def __init__(self, url: str) -> None:
        self._url = url
        # Named as the agent's memory is: the same setting (agent.memory.url), the same fix.
        self._where = f"conversation memory {without_password(url)}"
        self._conn: AsyncConnection[Any] | None = None
        self._unwritten: dict[tuple[str, str], list[tuple[Change, tuple[Any, ...]]]] = {}
        """Each pin's changes not written yet, in order, pins first come first: a pin's later
        change takes the place of its earlier one (only the last is the pin's state). Queued
        as they came, 10,000 at most, an upstream rewriting its tools at every listing while
        the database was away filled the queue with definitions it then dropped, one ERROR
        line each, the last changes lost; now one entry a pin at most, and nothing dropped."""
        self._more = anyio.Event()
        self._closed = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SharedPins]:
        """Connected, the table made, and the writer running until the block ends (then the
        changes still queued get ``_FLUSH_BOUND`` seconds to be written).

        Raises:
            StoreUnavailable: the database cannot be reached, or the table cannot be made.
        """
        self._conn = await self._connect()
        try:
            await set_up(self._conn, self._make)
        except Exception as exc:
            await self._conn.close()
            raise StoreUnavailable(f"{self._where}: cannot create the tool pins' table: {exc}") from exc
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_all)
                try:
                    yield self
                finally:
                    self._closed = True  # the writer ends once nothing is left to write
                    self._more.set()
                    # It gets that long, shielded from a shutdown's cancel, and no longer.
                    tg.cancel_scope.shield = True
                    tg.cancel_scope.deadline = anyio.current_time() + _FLUSH_BOUND
            if tg.cancel_scope.cancelled_caught:
                logger.warning("%s: tool pin changes left unwritten at shutdown", self._where)
        finally:
            await self._drop()

    async def rows(self) -> list[tuple[Any, ...]]:
        """Every pin, as ``Pins``' table holds it (raises ``StoreUnavailable``)."""
        try:
            cursor = await self._run(_ROWS)
            return [tuple(row) for row in await cursor.fetchall()]
        except psycopg.Error as exc:
            raise StoreUnavailable(f"{self._where}: cannot read the tool pins: {exc}") from exc

    def write(self, change: Change, params: tuple[Any, ...]) -> None:
        """Queue one change of this replica's copy, to be written in order."""
        key = (params[3], params[4]) if change == "flag" else (params[0], params[1])
        queued = self._unwritten.setdefault(key, [])
        if queued and queued[-1][0] != "pin" and change != "pin":
            queued.pop()  # a flag or clear not written yet: this one says what the pin is now
        queued.append((change, params))
        self._more.set()

    async def _make(self) -> None:
        assert self._conn is not None
        await self._conn.execute(_CREATE)

    async def _connect(self) -> AsyncConnection[Any]:
        try:
            return await AsyncConnection.connect(self._url, autocommit=True, connect_timeout=_CONNECT_BOUND)
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreUnavailable(f"{self._where}: cannot reach Postgres: {reason}") from exc

    async def _run(self, query: LiteralString, params: tuple[Any, ...] = ()) -> psycopg.AsyncCursor[Any]:
        """``query`` answered within ``_ANSWER_BOUND`` (raises ``StoreUnavailable``, the
        connection let go: its next use connects anew, or ``psycopg.Error``)."""
        conn = await self._connected()
        try:
            with anyio.fail_after(_ANSWER_BOUND):
                return await conn.execute(query, params)
        except TimeoutError:
            await self._drop()
            raise StoreUnavailable(f"{self._where}: did not answer within {_ANSWER_BOUND:g} s") from None

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.move_on_after(1, shield=True):  # closing on a frozen peer may never end
                await conn.close()

    async def _connected(self) -> AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await self._connect()
        return self._conn

    async def _write_all(self) -> None:
        while True:
            await self._more.wait()
            self._more = anyio.Event()
            while self._unwritten:
                key = next(iter(self._unwritten))
                queued = self._unwritten[key]
                change, params = queued.pop(0)
                if not queued:
                    del self._unwritten[key]
                await self._written(change, params)
            if self._closed:
                return

    async def _written(self, change: Change, params: tuple[Any, ...]) -> None:
        """Write one change, retrying while the database is away (each failure logged once)."""
        failing = False
        while True:
            try:
                await self._run(_WRITES[change], params)
                if failing:
                    logger.warning("%s: tool pins written again", self._where)
                return
            except (psycopg.Error, StoreUnavailable) as exc:
                if not failing:
                    logger.error("%s: cannot write a tool pin (%s); retrying", self._where, exc)
                failing = True
                await anyio.sleep(_RETRY)


def listed(url: str) -> list[tuple[str, str, float, str | None]]:
    """``pins list`` on the shared database (the command line: no event loop)."""
    with _connection(url) as conn:
        return [tuple(row) for row in conn.execute(_LIST).fetchall()]  # pyright: ignore[reportReturnType]


def accepted(url: str, names: Sequence[str] | None) -> list[str]:
    """``pins accept`` on the shared database: the names whose pending change was accepted."""
    with _connection(url) as conn:
        rows = conn.execute(_ACCEPT, (names is None, list(names or ()))).fetchall()
    return sorted(str(row[0]) for row in rows)


def _connection(url: str) -> psycopg.Connection[Any]:
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=_CONNECT_BOUND)
        conn.execute(_CREATE)
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"conversation memory {without_password(url)}: cannot reach Postgres: {exc}"
        ) from exc
    return conn
