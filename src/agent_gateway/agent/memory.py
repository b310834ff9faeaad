"""Conversation memory: the LangGraph checkpointer runs are kept in, and the history a model sees.

The SQLite store is opened on the first run, not at start-up: a gateway whose clients never
call ``ask_agent`` creates no file. The Postgres store (several replicas) is opened at
start-up, so a replica that cannot reach it says so at once (``agent/postgres_memory.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately, trim_messages
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from agent_gateway.compat.langgraph import THREADS_IN_STORE, keep_latest_in_memory, keep_latest_sqlite
from agent_gateway.config import MemoryConfig
from agent_gateway.errors import AgentError
from agent_gateway.private_files import private
from agent_gateway.runtime import CLEANUP_TIMEOUT

if TYPE_CHECKING:
    from agent_gateway.agent.postgres_memory import PostgresThreads

logger = logging.getLogger(__name__)

_NO_RESULT = (
    "No result: the run ended (cancelled, failed or at its step limit) before this call returned; "
    "it may or may not have taken effect."
)
_DAY = 86_400.0
# LangGraph's SQLite schema: checkpoint ids sort in time order (its own "latest" is MAX).
# When each thread was last used, next to LangGraph's tables; threads from before the table
# existed count as used when the store is opened.
_THREADS = (
    "CREATE TABLE IF NOT EXISTS agent_gateway_threads (thread_id TEXT PRIMARY KEY, used_at REAL NOT NULL)"
)
_ADOPT = f"INSERT OR IGNORE INTO agent_gateway_threads (thread_id, used_at) SELECT thread_id, ? FROM ({THREADS_IN_STORE})"
# Whose each thread is (a digest of the client's label), for the bound on threads per client;
# threads from before the column existed belong to no one and only expire.
_OWNERS = "ALTER TABLE agent_gateway_threads ADD COLUMN owner TEXT"
_BY_OWNER = "CREATE INDEX IF NOT EXISTS agent_gateway_threads_owner ON agent_gateway_threads (owner, used_at)"
_USED = (
    "INSERT INTO agent_gateway_threads (thread_id, used_at, owner) VALUES (?, ?, ?) "
    "ON CONFLICT(thread_id) DO UPDATE SET used_at = excluded.used_at, "
    "owner = COALESCE(agent_gateway_threads.owner, excluded.owner)"
)
_CROWDED = (
    "SELECT thread_id FROM agent_gateway_threads WHERE owner = ? ORDER BY used_at DESC LIMIT -1 OFFSET ?"
)
_EXPIRED = "SELECT thread_id FROM agent_gateway_threads WHERE used_at < ?"
_USED_AT = "SELECT used_at FROM agent_gateway_threads WHERE thread_id = ?"
_FORGET = "DELETE FROM agent_gateway_threads WHERE thread_id = ?"

_UNWRITABLE = frozenset(
    {"SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_BUSY", "SQLITE_LOCKED"}
)
"""SQLite's errors of a file that cannot be written (and their extended codes: ``SQLITE_IOERR_WRITE``),
another process's lock on it (``database is locked``) among them."""


class Conversations:
    """Owns the checkpointer. Use ``async with conversations:``; it closes the store on exit.

    Each thread is compacted to its latest checkpoint after every run; a thread no run has
    used for ``retention_days`` is deleted (``expired`` finds them, ``forget`` deletes), and so
    is a client's least recently used thread past its ``max_threads`` (``crowded``, ``evict``).
    """

    def __init__(self, config: MemoryConfig) -> None:
        self._config = config
        self._lock = anyio.Lock()
        self._stack = AsyncExitStack()
        self._saver: BaseCheckpointSaver[str] | None = None
        self._used: dict[str, float] = {}  # the in-memory store's use times
        self._owners: dict[str, str] = {}  # and whose each thread is
        self._shared: PostgresThreads | None = None
        self._file: tuple[int, int] | None = None  # the SQLite file opened: its device and inode

    @property
    def problem(self) -> str | None:
        """Why the shared database does not answer now (None: it does, or none is used)."""
        return self._shared.problem if self._shared is not None else None

    def lost(self, exc: BaseException) -> str | None:
        """Why ``exc`` says the shared database is gone (taken as down until its next check),
        or the SQLite file cannot be written (a full disk, a read-only file): or None, another
        error. A full disk logged a traceback per run, as a bug would."""
        if self._shared is not None:
            return self._shared.lost(exc)
        if "_".join(str(getattr(exc, "sqlite_errorname", "")).split("_")[:2]) in _UNWRITABLE:
            return f"the conversation memory {self._config.path} cannot be written: {exc}"
        return None

    async def watch(self) -> None:
        """Report the shared database's health until cancelled (nothing to watch otherwise)."""
        if self._shared is not None:
            await self._shared.watch()

    @property
    def retention(self) -> float | None:
        """Seconds a thread is kept unused, or None (for ever)."""
        days = self._config.retention_days
        return None if days is None else days * _DAY

    async def __aenter__(self) -> Conversations:
        if self._config.store == "postgres":
            try:
                await self.checkpointer()
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            await self._stack.aclose()
        self._saver = None

    async def checkpointer(self) -> BaseCheckpointSaver[str]:
        """The store, opened on first use.

        Raises:
            AgentError: the SQLite file cannot be opened.
        """
        async with self._lock:
            if self._saver is None:
                self._saver = await self._open()
            return self._saver

    async def _open(self) -> BaseCheckpointSaver[str]:
        if self._config.store == "memory":
            return InMemorySaver()
        if self._config.store == "postgres":
            assert self._config.url is not None, "validated: store postgres has a url"
            # Imported here: psycopg takes ~0.1 s of a start that does not use Postgres.
            from agent_gateway.agent.postgres_memory import PostgresThreads, open_postgres

            saver = await open_postgres(self._config.url, self._stack)
            self._shared = PostgresThreads(saver, self._config.url)
            return saver
        path = Path(self._config.path)
        try:
            # Closed here if it is not made ready: kept open on the store's stack, a file that
            # is no database left one connection (and its thread) behind for every run.
            async with AsyncExitStack() as opening:
                private(path)
                saver = await opening.enter_async_context(AsyncSqliteSaver.from_conn_string(str(path)))
                await _ready(saver)
                opened = await anyio.Path(path).stat()
                self._stack.push_async_exit(opening.pop_all())
        except Exception as exc:  # sqlite3 and OS errors alike: the run reports it, the gateway goes on
            raise AgentError(f"conversation memory {path}: cannot open the SQLite file: {exc}") from exc
        self._file = (opened.st_dev, opened.st_ino)
        logger.info("conversation memory: %s", path)
        return saver

    def _check_file(self) -> None:
        """Say (once) that the SQLite file was deleted or replaced under the store (an operator
        wiping conversations, a cleaner of temporary files, a restored backup). SQLite goes on
        in the file it opened, unlinked, and everything since is lost at the next start: it
        went unannounced. A new file is not opened in its place: the runs in flight write to
        this one, and a second connection beside it would share its WAL and lock files by name."""
        if self._file is None:
            return
        try:
            now_there = os.stat(self._config.path)
        except FileNotFoundError:
            now_there = None
        except OSError:  # cannot tell (a directory made unreadable): the writes will say
            return
        if now_there is not None and (now_there.st_dev, now_there.st_ino) == self._file:
            return
        self._file = None
        logger.warning(
            "conversation memory %s was %s while the gateway runs: runs go on in the file it opened, "
            "which is lost when the gateway stops; restart the gateway to use the file at that path",
            self._config.path,
            "deleted" if now_there is None else "replaced",
        )

    async def used(self, thread: str, owner: str) -> None:
        """Mark ``thread`` as used now by a run of ``owner`` (a digest of the client), so it is
        not expired under it; a thread keeps the owner it was first used by."""
        saver = await self.checkpointer()
        self._used[thread] = time.time()
        self._check_file()
        if self._shared is None and not isinstance(saver, AsyncSqliteSaver):
            self._owners.setdefault(thread, owner)
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            try:
                if self._shared is not None:
                    await self._shared.used(thread, self._used.pop(thread), owner)
                elif isinstance(saver, AsyncSqliteSaver):
                    async with saver.lock:
                        await saver.conn.execute(_USED, (thread, self._used.pop(thread), owner))
                        await saver.conn.commit()
            except Exception as exc:  # the run goes on (and says so if the store is down)
                logger.warning("conversation memory: thread %s could not be marked used: %s", thread, exc)

    async def compact(self, thread: str) -> None:
        """Keep only ``thread``'s latest checkpoint.

        Each step stores the whole (window-bounded) state; nothing reads older checkpoints, so
        without this a long conversation would store its window once per step, for ever.
        """
        saver = self._saver
        if self.problem is not None:  # the shared database is down: the thread's next run compacts it
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            try:
                if isinstance(saver, AsyncSqliteSaver):
                    async with saver.lock:
                        await keep_latest_sqlite(saver, thread)
                elif isinstance(saver, InMemorySaver):
                    keep_latest_in_memory(saver, thread)
                elif self._shared is not None:
                    await self._shared.compact(thread)
            except Exception as exc:  # a store that cannot be compacted still serves; say so
                if (why := self.lost(exc)) is None:
                    logger.exception("conversation memory: thread %s could not be compacted", thread)
                else:
                    logger.warning("conversation memory: thread %s could not be compacted: %s", thread, why)

    async def expired(self) -> list[str]:
        """Threads no run has used for longer than the retention (none before the store opens)."""
        if self._saver is None or (cutoff := self._cutoff()) is None:
            return []
        if self._shared is not None:
            return await self._shared.expired(cutoff)
        if not isinstance(self._saver, AsyncSqliteSaver):
            return [t for t, at in self._used.items() if at < cutoff]
        saver = self._saver
        async with saver.lock, saver.conn.execute(_EXPIRED, (cutoff,)) as rows:
            return [str(row[0]) for row in await rows.fetchall()]

    async def forget(self, thread: str) -> bool:
        """Delete ``thread`` and all it holds if it is (still) expired; call under its run lock."""
        cutoff, used_at = self._cutoff(), await self._used_at(thread)
        if cutoff is None or used_at is None or used_at >= cutoff:
            return False
        await self._delete(thread)
        logger.info("conversation memory: thread %s expired and was deleted", thread)
        return True

    async def crowded(self, owner: str) -> list[str]:
        """``owner``'s threads past its ``max_threads`` most recently used (none without a bound)."""
        kept = self._config.max_threads
        if kept is None or self._saver is None:
            return []
        if self._shared is not None:
            return await self._shared.crowded(owner, kept)
        if not isinstance(self._saver, AsyncSqliteSaver):
            owned = sorted((t for t, o in self._owners.items() if o == owner), key=self._used.__getitem__)
            return owned[: max(0, len(owned) - kept)]
        saver = self._saver
        async with saver.lock, saver.conn.execute(_CROWDED, (owner, kept)) as rows:
            return [str(row[0]) for row in await rows.fetchall()]

    async def evict(self, thread: str, owner: str) -> bool:
        """Delete ``thread`` if it is (still) past ``owner``'s bound; call under its run lock."""
        if thread not in await self.crowded(owner):
            return False
        await self._delete(thread)
        logger.info(
            "conversation memory: thread %s deleted, its client's least recently used past %d (max_threads)",
            thread,
            self._config.max_threads,
        )
        return True

    async def _delete(self, thread: str) -> None:
        saver = await self.checkpointer()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            await saver.adelete_thread(thread)
            self._used.pop(thread, None)
            self._owners.pop(thread, None)
            if self._shared is not None:
                await self._shared.forget(thread)
            elif isinstance(saver, AsyncSqliteSaver):
                async with saver.lock:
                    await saver.conn.execute(_FORGET, (thread,))
                    await saver.conn.commit()

    async def _used_at(self, thread: str) -> float | None:
        saver = self._saver
        if self._shared is not None:
            return await self._shared.used_at(thread)
        if not isinstance(saver, AsyncSqliteSaver):
            return self._used.get(thread)
        async with saver.lock, saver.conn.execute(_USED_AT, (thread,)) as rows:
            row = await rows.fetchone()
        return None if row is None else float(row[0])

    def _cutoff(self) -> float | None:
        retention = self.retention
        return None if retention is None else time.time() - retention


async def _ready(saver: AsyncSqliteSaver) -> None:
    """LangGraph's tables, and the gateway's table of when each thread was used and by whom."""
    await saver.setup()
    async with saver.lock:
        await saver.conn.execute(_THREADS)
        async with saver.conn.execute("PRAGMA table_info(agent_gateway_threads)") as rows:
            if "owner" not in {row[1] for row in await rows.fetchall()}:
                await saver.conn.execute(_OWNERS)
        await saver.conn.execute(_BY_OWNER)
        await saver.conn.execute(_ADOPT, (time.time(),))
        await saver.conn.commit()


def model_view(system: str, history: Sequence[AnyMessage], max_tokens: int) -> list[AnyMessage]:
    """What the model is sent: the system message, then as much recent history as fits.

    Trimmed by token count from the oldest end, starting on a human message so that no tool
    call is ever separated from its result; tool calls left without a result (a run that was
    cancelled or hit its step limit) are answered with a note, as every provider requires.
    """
    messages: list[AnyMessage] = [SystemMessage(system), *_answered(history)]
    trimmed: list[AnyMessage] = trim_messages(  # pyright: ignore[reportAssignmentType]  # returns its input's type
        messages,
        max_tokens=max_tokens,
        token_counter=count_tokens_approximately,
        strategy="last",
        include_system=True,
        start_on="human",
        allow_partial=False,
    )
    if len(trimmed) <= 1 and len(messages) > 1:
        # The current turn alone is over budget: keep it whole rather than send nothing.
        trimmed = [messages[0], *_from_last_human(messages[1:])]
    return trimmed


def out_of_view(history: Sequence[AnyMessage], view: Sequence[AnyMessage]) -> list[AnyMessage]:
    """The stored messages older than the oldest one ``view`` still sends.

    The window only ever moves forward (same budget, history only grows), so these can never
    be sent again: dropping them from the thread keeps every checkpoint, and the SQLite file,
    bounded by the window instead of growing with the whole conversation.
    """
    first = next((m for m in view if not isinstance(m, SystemMessage)), None)
    for index, message in enumerate(history):
        if message is first:
            return list(history[:index])
    return []


def _answered(history: Sequence[AnyMessage]) -> list[AnyMessage]:
    answered = {m.tool_call_id for m in history if isinstance(m, ToolMessage)}
    out: list[AnyMessage] = []
    for message in history:
        out.append(message)
        if isinstance(message, AIMessage):
            out += [
                ToolMessage(content=_NO_RESULT, tool_call_id=c, status="error")
                for c in _call_ids(message)
                if c not in answered
            ]
    return out


def _call_ids(message: AIMessage) -> list[str]:
    ids = [c["id"] for c in message.tool_calls if c["id"]]
    return ids + [c["id"] for c in message.invalid_tool_calls if c["id"]]


def _from_last_human(history: list[AnyMessage]) -> list[AnyMessage]:
    last = max((i for i, m in enumerate(history) if isinstance(m, HumanMessage)), default=0)
    return history[last:]
