"""What an agent run tells the outside while it runs: the client's progress and log stream,
the gateway's own log, or a terminal.

Progress goes out once per model turn and once per tool call, so that a client whose request
timeout resets on progress never times out a long run.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, NotRequired, Protocol, TypedDict

import anyio
import mcp_types as types

from agent_gateway.activity import Run
from agent_gateway.downstream.caller import Caller
from agent_gateway.logs import clipped
from agent_gateway.runtime import SEND_TIMEOUT

logger = logging.getLogger(__name__)

MAX_RECORDED_ARGUMENTS = 1_000
"""Characters of one tool call's arguments (as JSON) a run's record and its events keep; longer
ones are kept cut, as ``{"cut_by_gateway": "<their start>… (N characters)"}``. A model's
reply may hold 500,000 characters of arguments a turn: the record kept each call's whole, and
one run's record (non-ASCII arguments, six bytes each once JSON-escaped) passed the client's
1 MiB bound on an answer, and was stored again at every step."""


class ToolCallRecord(TypedDict):
    """One tool call of a run, as ``structuredContent.tool_calls`` lists it."""

    name: str
    arguments: dict[str, Any]
    is_error: bool
    duration_ms: float
    result_cut: NotRequired[str]
    """Why the model was given its result cut (the run's turn at its bound), when it was."""


def recorded(arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call's ``arguments`` as a record or an event keeps them: whole, or cut saying how
    long they were."""
    text = json.dumps(arguments, ensure_ascii=False, default=str)
    if len(text) <= MAX_RECORDED_ARGUMENTS:
        return arguments
    return {"cut_by_gateway": clipped(text, MAX_RECORDED_ARGUMENTS)}


class RunObserver(Protocol):
    """Told of each step of a run, in order (tool events of one turn may interleave)."""

    async def model_turn(self, step: int) -> None: ...

    async def tool_started(self, name: str, arguments: dict[str, Any]) -> None: ...

    async def tool_finished(self, record: ToolCallRecord) -> None: ...


class LogObserver:
    """The gateway's own log: names and argument keys only, never argument values."""

    def __init__(self, run_id: str) -> None:
        self._run = run_id

    async def model_turn(self, step: int) -> None:
        logger.debug("agent run %s: model turn %d", self._run, step)

    async def tool_started(self, name: str, arguments: dict[str, Any]) -> None:
        logger.info(
            "agent run %s: calling %s (arguments: %s)", self._run, name, ", ".join(arguments) or "none"
        )

    async def tool_finished(self, record: ToolCallRecord) -> None:
        logger.info(
            "agent run %s: %s %s in %.1f ms",
            self._run,
            record["name"],
            "failed" if record["is_error"] else "returned",
            record["duration_ms"],
        )


class ClientObserver:
    """Progress under the client's token and log lines on the client's log stream."""

    def __init__(self, caller: Caller, tool_name: str, also: RunObserver) -> None:
        self._caller = caller
        self._name = tool_name
        self._also = also
        self._progress = 0
        # Concurrent tool calls report at once; progress must reach the client increasing.
        self._lock = anyio.Lock()

    async def model_turn(self, step: int) -> None:
        await self._also.model_turn(step)
        await self._report(f"step {step}: asking the model")

    async def tool_started(self, name: str, arguments: dict[str, Any]) -> None:
        await self._also.tool_started(name, arguments)
        await self._report(f"calling {name}")
        await self._log("info", {"event": "tool_started", "tool": name, "arguments": recorded(arguments)})

    async def tool_finished(self, record: ToolCallRecord) -> None:
        await self._also.tool_finished(record)
        await self._log("error" if record["is_error"] else "info", {"event": "tool_finished", **record})

    async def _report(self, message: str) -> None:
        token = self._caller.progress_token
        if token is None:
            return
        async with self._lock:
            self._progress += 1
            # A client that has gone away only stops hearing; the run goes on to its end.
            with anyio.move_on_after(SEND_TIMEOUT), _gone_quietly():
                await self._caller.server_session.send_progress_notification(
                    progress_token=token,
                    progress=self._progress,
                    message=message,
                    related_request_id=None
                    if self._caller.request_id is None
                    else str(self._caller.request_id),
                )

    async def _log(self, level: types.LoggingLevel, data: dict[str, Any]) -> None:
        # Round-tripped through JSON so any argument value the model produced can be sent.
        line = types.LoggingMessageNotificationParams(
            level=level, data=json.loads(json.dumps(data, default=str))
        )
        with _gone_quietly():
            await self._caller.log(self._name, line)


def _gone_quietly() -> contextlib.suppress:
    return contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError)


class RecordedObserver:
    """Keeps a run's steps in its ``activity.Run`` (the status page), then tells ``also``."""

    def __init__(self, run: Run, also: RunObserver) -> None:
        self._run = run
        self._also = also

    async def model_turn(self, step: int) -> None:
        self._run.turn(step)
        await self._also.model_turn(step)

    async def tool_started(self, name: str, arguments: dict[str, Any]) -> None:
        self._run.tool_started(name)
        await self._also.tool_started(name, arguments)

    async def tool_finished(self, record: ToolCallRecord) -> None:
        self._run.tool_finished(record["name"], record["is_error"], record["duration_ms"])
        await self._also.tool_finished(record)


class TerminalObserver:
    """A run's steps as lines for a person at a terminal (``agent-gateway ask``)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write

    async def model_turn(self, step: int) -> None:
        self._write(f"[step {step}] asking the model")

    async def tool_started(self, name: str, arguments: dict[str, Any]) -> None:
        self._write(f"  -> {name} {json.dumps(recorded(arguments), ensure_ascii=False, default=str)}")

    async def tool_finished(self, record: ToolCallRecord) -> None:
        outcome = "failed" if record["is_error"] else "ok"
        self._write(f"  <- {record['name']} {outcome} ({record['duration_ms']:.1f} ms)")
