"""Tool pinning: a tool's definition is recorded when first seen, and a later change of it (a
"rug pull": a new description telling models to call something else first, a new schema) is
flagged, and by default withheld from clients and the agent until an operator accepts it.

The record is a SQLite file next to the agent's memory (``pins.sqlite``, mode 0600, its
directory 0700), so a restart keeps it; with the memory in Postgres (several replicas) it is
a table there, which every replica loads and writes through (``pins_postgres.py``). A pin belongs to the tool's public name *and* the
upstream as configured (command and arguments, or URL): pointing an upstream at another
server starts its pins afresh, the same server changing its tools does not.

Modes (``pinning:``): ``hold`` (default) withholds a changed tool; ``warn`` serves it and
warns; ``off`` records nothing. Checked when an upstream's part of the catalog is built (one
transaction per upstream listing), never per call.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import mcp_types as types
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from agent_gateway.config import GatewayConfig
from agent_gateway.errors import CannotServe, StoreUnavailable
from agent_gateway.pin_digest import FIELDS, digest_of, pinned_form
from agent_gateway.private_files import private

if TYPE_CHECKING:
    from agent_gateway.pins_postgres import Change, SharedPins

logger = logging.getLogger(__name__)

PinningMode = Literal["hold", "warn", "off"]  # as GatewayConfig.pinning
MAX_PINS = 10_000
"""Tool names one upstream (as configured) has pinned at most. A pin outlives its tool's
listing (a tool removed and listed again changed is still caught), so an upstream listing
ever-new names would grow the file, and each review's read of it, without end; past this a
new name is not pinned and, in ``hold`` mode, withheld like a changed tool."""
NAMED_CHANGES = 5
"""Changed tools one listing's WARNING names besides the first; the rest are counted."""
REVIEW_AGAIN_EVERY = 5.0
"""Seconds between two listings of an upstream whose last review could not be written."""

_open_pins: weakref.WeakSet[Pins] = weakref.WeakSet()


def _held(_: CallbackOptions) -> Iterable[Observation]:
    yield Observation(sum(p.pending() for p in list(_open_pins)))


metrics.get_meter("agent-gateway").create_observable_gauge(
    "agent_gateway.tools.changed",
    callbacks=[_held],
    description="Pinned tools whose definition changed and is not accepted yet (held, under pinning: hold).",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pins (
    source TEXT NOT NULL,
    name TEXT NOT NULL,
    upstream TEXT NOT NULL,
    digest TEXT NOT NULL,
    definition TEXT NOT NULL,
    first_seen REAL NOT NULL,
    pending_digest TEXT,
    pending_definition TEXT,
    changed TEXT,
    PRIMARY KEY (source, name)
)
"""
# Counting the changed tools after each upstream's review must not read every pin: with
# 10,000 pins that scan, once per upstream, was 6 % of a gateway's start-up.
_PENDING_INDEX = "CREATE INDEX IF NOT EXISTS pins_pending ON pins (source) WHERE pending_digest IS NOT NULL"


@dataclass(frozen=True)
class Pin:
    """One pinned tool as ``pins list`` shows it."""

    name: str
    upstream: str
    first_seen: float
    changed: str | None
    """The fields of a pending change (``description, inputSchema``), or None: as pinned."""


def pins_path(config: GatewayConfig) -> Path:
    return Path(config.agent.memory.path).parent / "pins.sqlite"


def pins_for(config: GatewayConfig) -> Pins:
    """Tool pins where the agent's memory is: its SQLite directory, the shared Postgres of
    several replicas, or (memory in memory) this process only."""
    memory = config.agent.memory
    if memory.store == "postgres":
        assert memory.url is not None, "validated: store postgres has a url"
        # Imported here: psycopg takes ~0.1 s of a start that does not use Postgres.
        from agent_gateway.pins_postgres import SharedPins

        return Pins(None, config.pinning, SharedPins(memory.url))
    return Pins(pins_path(config) if memory.store == "sqlite" else None, config.pinning)


class Pins:
    """The pinned definitions, and what a new listing of an upstream holds back."""

    def __init__(
        self, path: Path | None, mode: PinningMode = "hold", shared: SharedPins | None = None
    ) -> None:
        """``path`` None: kept in this process only, unless ``shared`` (the database every
        replica shares) holds them: this process then works on a copy in memory."""
        self.mode = mode
        self._path = path
        self._shared = shared
        self._connection: sqlite3.Connection | None = None
        self._pending = 0
        self._unwritten: set[str] = set()
        """Upstreams whose last review could not be written: listed again until one is."""
        _open_pins.add(self)

    @asynccontextmanager
    async def running(self, relist: Callable[[str], None]) -> AsyncIterator[None]:
        """With a shared database: connected and loaded before any listing is reviewed, its
        writer running until the block ends (raises ``StoreUnavailable``). Meanwhile an
        upstream whose review could not be written is listed again (``relist``) every
        ``REVIEW_AGAIN_EVERY`` seconds until one is: its withheld tools are then served,
        though the upstream itself may never list again."""
        if self._shared is None and self.mode != "off":
            self._opened()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._review_again, relist)
            if self._shared is None:
                yield
            else:
                async with self._shared.running() as shared:
                    self._load(await shared.rows())
                    yield
            tg.cancel_scope.cancel()

    async def _review_again(self, relist: Callable[[str], None]) -> None:
        while True:
            await anyio.sleep(REVIEW_AGAIN_EVERY)
            for upstream in sorted(self._unwritten):
                relist(upstream)

    async def refresh(self) -> None:
        """This process's copy as the shared database has it now (a reload: pins accepted
        meanwhile are then served); kept as it is while the database does not answer."""
        if self._shared is None:
            return
        try:
            rows = await self._shared.rows()
        except StoreUnavailable as exc:
            logger.warning("%s: this replica's copy kept", exc)
            return
        self._load(rows)

    def _load(self, rows: list[tuple[Any, ...]]) -> None:
        with self._db:
            self._db.execute("DELETE FROM pins")
            self._db.executemany(f"INSERT INTO pins VALUES ({', '.join('?' * 9)})", rows)
        self._pending = self._count_pending()
        logger.info("tool pins: %d loaded from the shared database", len(rows))

    def _opened(self) -> None:
        """Open the file now, at start-up: one that is no database (a log written over it, a
        directory) took every upstream down at its first listing, retried for ever.

        Raises:
            CannotServe: the file cannot be read as tool pins.
        """
        try:
            self._db  # noqa: B018 (opened by the property)
        except (sqlite3.DatabaseError, OSError) as exc:
            raise CannotServe(f"tool pins {self._path}: cannot be read: {exc}") from None

    @property
    def _db(self) -> sqlite3.Connection:
        """The file, opened on first use (a gateway that never starts opens nothing)."""
        if self._connection is None:
            self._connection = _open(self._path)
            self._pending = self._count_pending()
        return self._connection

    def pending(self) -> int:
        """Tools with a changed definition not accepted yet (the metric's value)."""
        return self._pending

    def _count_pending(self) -> int:
        return int(
            self._db.execute("SELECT COUNT(*) FROM pins WHERE pending_digest IS NOT NULL").fetchone()[0]
        )

    def close(self) -> None:
        """Close the file (reopened if used again)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def review(self, upstream: str, source: str, tools: Mapping[str, types.Tool]) -> dict[str, str]:
        """Record ``upstream``'s ``tools`` (public name to definition); the ones to withhold,
        each with what changed (empty unless mode is ``hold``)."""
        if self.mode == "off" or not tools:
            self._unwritten.discard(upstream)
            return {}
        known = {
            row[0]: row[1:]
            for row in self._db.execute(
                "SELECT name, digest, pending_digest, definition FROM pins WHERE source = ?", (source,)
            )
        }
        held: dict[str, str] = {}
        flagged: dict[str, str] = {}
        room, unpinned = MAX_PINS - len(known), 0
        full = f"new, and its upstream has pinned {MAX_PINS:,} tool names already"
        try:
            with self._db:
                for name, tool in tools.items():
                    definition, canonical = pinned_form(name, tool)
                    digest = digest_of(canonical)
                    pinned = known.get(name)
                    if pinned is None and room <= 0:
                        unpinned += 1
                        if self.mode == "hold":
                            held[name] = full
                    elif pinned is None:
                        room -= 1
                        self._pin(source, name, upstream, digest, canonical)
                    elif pinned[0] == digest:
                        if pinned[1] is not None:  # changed back to what was accepted
                            self._db.execute(_CLEAR, (source, name))
                            self._written("clear", (source, name))
                    else:
                        what = _changed_fields(json.loads(pinned[2]), definition)
                        if pinned[1] != digest:
                            self._flag(source, name, upstream, digest, canonical, what)
                            flagged[name] = what
                        if self.mode == "hold":
                            held[name] = what
        except sqlite3.OperationalError as exc:  # a full disk took the upstream down, restarted it
            held = self._unrecorded(upstream, tools, known, exc)
            self._unwritten.add(upstream)
        else:
            if upstream in self._unwritten:
                self._unwritten.discard(upstream)
                logger.warning("upstream %s: its tools' pins recorded again in %s", upstream, self._path)
        self._pending = self._count_pending()
        if flagged:
            self._warn_changed(upstream, flagged)
        if unpinned:
            action = "withheld" if self.mode == "hold" else "served unpinned"
            logger.warning("upstream %s: %d new tools %s: %s", upstream, unpinned, action, full)
        return held

    def _unrecorded(
        self, upstream: str, tools: Mapping[str, types.Tool], known: Mapping[str, Any], exc: Exception
    ) -> dict[str, str]:
        """Those of ``tools`` withheld when their review could not be written (a full disk, a
        read-only file): in ``hold`` mode the new and the changed ones, as past ``MAX_PINS``;
        the rest of the upstream is served, and it is listed and reviewed again (``running``)."""
        unrecorded: dict[str, str] = {}
        for name, tool in tools.items():
            definition, canonical = pinned_form(name, tool)
            if (pinned := known.get(name)) is None:
                unrecorded[name] = f"new, and its pin could not be recorded ({exc})"
            elif pinned[0] != digest_of(canonical):
                unrecorded[name] = _changed_fields(json.loads(pinned[2]), definition)
        action = "withheld" if self.mode == "hold" else "served unpinned"
        logger.log(
            logging.DEBUG if upstream in self._unwritten else logging.WARNING,  # once, not each retry
            "upstream %s: its tools' pins not recorded in %s (%s): %d new or changed tools %s",
            upstream,
            self._path,
            exc,
            len(unrecorded),
            action,
        )
        return unrecorded if self.mode == "hold" else {}

    def pins(self) -> list[Pin]:
        rows = self._db.execute(
            "SELECT name, upstream, first_seen, changed FROM pins ORDER BY upstream, name"
        )
        return [Pin(*row) for row in rows]

    def accept(self, names: list[str] | None) -> list[str]:
        """Accept the pending changes of ``names`` (None: all); the names accepted."""
        pending = [r[0] for r in self._db.execute("SELECT name FROM pins WHERE pending_digest IS NOT NULL")]
        chosen = sorted({n for n in pending if names is None or n in names})
        with self._db:
            for name in chosen:
                self._db.execute(_ACCEPT, (name,))
        self._pending = self._count_pending()
        return chosen

    def _pin(self, source: str, name: str, upstream: str, digest: str, definition: str) -> None:
        row = (source, name, upstream, digest, definition, time.time())
        self._db.execute(
            "INSERT INTO pins (source, name, upstream, digest, definition, first_seen) VALUES (?, ?, ?, ?, ?, ?)",
            row,
        )
        self._written("pin", row)

    def _flag(self, source: str, name: str, upstream: str, digest: str, definition: str, what: str) -> None:
        change = (digest, definition, what, source, name)
        self._db.execute(
            "UPDATE pins SET pending_digest = ?, pending_definition = ?, changed = ? WHERE source = ? AND name = ?",
            change,
        )
        self._written("flag", change)

    def _warn_changed(self, upstream: str, flagged: Mapping[str, str]) -> None:
        """One line a listing (a line a tool: an upstream changing 10,000 at each wrote 10,000)."""
        (name, what), *rest = flagged.items()
        named = ", ".join(f"{n} ({w})" for n, w in rest[:NAMED_CHANGES])
        more = f"; {len(rest):,} more (pins list): {named}{', …' if len(rest) > NAMED_CHANGES else ''}"
        action = "withheld until accepted (agent-gateway pins accept)" if self.mode == "hold" else "served"
        logger.warning(
            "upstream %s changed tool %s since it was pinned (%s)%s: %s",
            upstream,
            name,
            what,
            more if rest else "",
            action,
        )

    def _written(self, change: Change, params: tuple[Any, ...]) -> None:
        if self._shared is not None:
            self._shared.write(change, params)


_CLEAR = "UPDATE pins SET pending_digest = NULL, pending_definition = NULL, changed = NULL WHERE source = ? AND name = ?"
_ACCEPT = (
    "UPDATE pins SET digest = pending_digest, definition = pending_definition, pending_digest = NULL, "
    "pending_definition = NULL, changed = NULL WHERE name = ? AND pending_digest IS NOT NULL"
)


def _changed_fields(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    return ", ".join(f for f in FIELDS if before.get(f) != after.get(f)) or "definition"


def _open(path: Path | None) -> sqlite3.Connection:
    if path is None:
        db = sqlite3.connect(":memory:", check_same_thread=False)
    else:
        private(path)
        db = sqlite3.connect(path, check_same_thread=False)
    db.execute(_SCHEMA)
    db.execute(_PENDING_INDEX)
    db.commit()
    return db
