"""Conversation memory: the LangGraph checkpointer runs are kept in, and the history a model sees.

The SQLite store is opened on the first run, not at start-up: a gateway whose clients never
call ``ask_agent`` creates no file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately, trim_messages
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from agent_gateway.config import MemoryConfig
from agent_gateway.errors import AgentError

logger = logging.getLogger(__name__)

_NO_RESULT = (
    "No result: the run ended (cancelled, failed or at its step limit) before this call returned; "
    "it may or may not have taken effect."
)
_CLOSE_TIMEOUT = 5.0
# LangGraph's SQLite schema: checkpoint ids sort in time order (its own "latest" is MAX).
_PRUNE = (
    "DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id < "
    "(SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '')"
)


class Conversations:
    """Owns the checkpointer. Use ``async with conversations:``; it closes the store on exit."""

    def __init__(self, config: MemoryConfig) -> None:
        self._config = config
        self._lock = anyio.Lock()
        self._stack = AsyncExitStack()
        self._saver: BaseCheckpointSaver[str] | None = None

    async def __aenter__(self) -> Conversations:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT):
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
        path = Path(self._config.path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            saver = await self._stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(path)))
            await saver.setup()
        except Exception as exc:  # sqlite3 and OS errors alike: the run reports it, the gateway goes on
            raise AgentError(f"conversation memory {path}: cannot open the SQLite file: {exc}") from exc
        logger.info("conversation memory: %s", path)
        return saver

    async def compact(self, thread: str) -> None:
        """Keep only ``thread``'s latest checkpoint in the SQLite store.

        Each step stores the whole (window-bounded) state; nothing reads older checkpoints, so
        without this a long conversation would write its window to disk once per step, for
        ever. The in-memory store is not compacted (it is for tests and short-lived use).
        """
        saver = self._saver
        if not isinstance(saver, AsyncSqliteSaver):
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT):
            try:
                async with saver.lock:
                    for table in ("writes", "checkpoints"):
                        await saver.conn.execute(_PRUNE.format(table=table), (thread, thread))
                    await saver.conn.commit()
            except Exception:  # a store that cannot be compacted still serves; say so
                logger.exception("conversation memory: thread %s could not be compacted", thread)


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
