"""What the gateway did lately: every finished client call, seen once, and the agent's runs.

One place sees each ``tools/call``, ``prompts/get`` and ``resources/read`` a client made,
after it finished: who made it (client, session), what it named (public name, upstream), how
it ended (outcome, why), how long it took and its trace id. That one ``Call`` is
- written as the access log line (INFO, logger ``agent_gateway.calls``; with
  ``log_format: json`` its fields are the line's fields),
- kept among the last ``calls`` for the status page,
- handed to every subscriber (the audit log subscribes here).
The agent's runs are kept the same way, with their steps as they happen.

Everything is bounded: the last N calls and runs, each text cut to a few hundred characters.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Literal

logger = logging.getLogger("agent_gateway.calls")

Outcome = Literal["ok", "tool_error", "paused", "refused", "error", "cancelled"]
RunStatus = Literal["running", "answered", "paused", "failed", "cancelled"]

CALLED = frozenset({"tools/call", "prompts/get", "resources/read"})
"""The client requests that are calls (recorded and logged once each)."""

KEEP_CALLS = 200
KEEP_RUNS = 50
_TEXT = 300


def cut(text: str | None, limit: int = _TEXT) -> str | None:
    """``text`` on one line, at most ``limit`` characters (a client may send anything)."""
    if text is None:
        return None
    # Flattened from its start only: an upstream's error result of 51 MB of short words,
    # split whole, took the gateway from 0.3 to 1.45 GB.
    head = text[: limit * 4]
    flat = " ".join(head.split())
    return flat if len(flat) <= limit and len(head) == len(text) else f"{flat[: limit - 1]}…"


@dataclass(frozen=True, slots=True)
class Call:
    """One finished client call."""

    at: float
    """When it started (epoch seconds)."""
    client: str
    """The client's name (token name or JWT subject; ``anonymous`` without auth)."""
    software: str | None
    """What the client says it is (``clientInfo.name``), when it says."""
    session: str | None
    """Its gateway session id (None in the modern era, where every request stands alone)."""
    method: str
    name: str
    upstream: str | None
    """The upstream it went to; None for the gateway's own tools and names it does not know."""
    outcome: Outcome
    detail: str | None
    """Why, when it did not end ``ok``."""
    duration_ms: float
    trace_id: str | None
    arguments_digest: str | None = None
    """SHA-256 of the arguments' canonical JSON (tools and prompts), for the audit trail."""
    arguments: Any = None
    """The arguments themselves: kept only with ``audit.arguments: full``, never logged."""
    arguments_bytes: int = 0
    """The size of ``arguments`` as JSON (the audit writer's queue is bounded in bytes)."""
    run: str | None = None
    """The ``ask_agent`` run that made it for the client (its run id); None: the client did."""

    @property
    def failed(self) -> bool:
        return self.outcome not in ("ok", "paused")

    def fields(self) -> dict[str, Any]:
        """The access line's fields: every one but the arguments, as they are (all are flat,
        so no copy is needed: ``asdict`` deep-copied them, a third of the line's cost)."""
        return {"event": "call", **{name: getattr(self, name) for name in _LOGGED}}

    def line(self) -> str:
        session = f" session {self.session}" if self.session else ""
        session += f" for agent run {self.run}" if self.run else ""
        where = f" -> {self.upstream}" if self.upstream else ""
        why = f" ({self.detail})" if self.detail else ""
        trace = f" trace {self.trace_id}" if self.trace_id else ""
        return (
            f"{self.method} {self.name} by {self.client}{session}{where}: "
            f"{self.outcome}{why} in {self.duration_ms:.1f} ms{trace}"
        )


_LOGGED = tuple(f.name for f in fields(Call) if f.name not in ("arguments", "arguments_bytes"))

CallListener = Callable[[Call], None]

_REFUSALS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "agent_gateway_refusals", default=None
)


@contextmanager
def noting_refusals() -> Iterator[list[str]]:
    """While a call is handled: the reasons it was refused, when it was (see ``refused``)."""
    noted: list[str] = []
    token = _REFUSALS.set(noted)
    try:
        yield noted
    finally:
        _REFUSALS.reset(token)


def refused(reason: str) -> None:
    """The call being handled was refused (policy, a limit) though it is answered as a tool
    result: it is recorded ``refused``, not ``tool_error``."""
    if (noted := _REFUSALS.get()) is not None:
        noted.append(reason)


@dataclass(frozen=True, slots=True)
class Step:
    """One tool call an agent run made."""

    name: str
    is_error: bool
    duration_ms: float


@dataclass(eq=False)
class Run:
    """One ``ask_agent`` run, updated as it goes."""

    run_id: str
    thread: str
    client: str
    started: float = field(default_factory=time.time)
    status: RunStatus = "running"
    model_turns: int = 0
    steps: list[Step] = field(default_factory=list)
    calling: list[str] = field(default_factory=list)
    """Tools called and not yet answered."""
    error: str | None = None
    ended: float | None = None

    def turn(self, step: int) -> None:
        self.model_turns = step

    def tool_started(self, name: str) -> None:
        self.calling.append(name)

    def tool_finished(self, name: str, is_error: bool, duration_ms: float) -> None:
        if name in self.calling:
            self.calling.remove(name)
        self.steps.append(Step(name, is_error, duration_ms))

    def finish(self, status: RunStatus, error: str | None) -> None:
        self.status = status
        self.error = cut(error)
        self.ended = time.time()
        self.calling.clear()


class Activity:
    """The last ``calls`` calls and ``runs`` agent runs, and the subscribers to each call."""

    def __init__(self, calls: int = KEEP_CALLS, runs: int = KEEP_RUNS) -> None:
        self.calls: deque[Call] = deque(maxlen=calls)
        self.runs: deque[Run] = deque(maxlen=runs)
        self.count = 0
        """Calls finished since start (those kept and those no longer kept)."""
        self._listeners: list[CallListener] = []

    def subscribe(self, listener: CallListener) -> None:
        """Call ``listener`` with every finished call, in order (it must not block)."""
        self._listeners.append(listener)

    def finished(self, call: Call) -> None:
        """Record ``call``: log its access line, keep it, tell the subscribers."""
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s", call.line(), extra={"fields": call.fields()})
        self.calls.append(call)
        self.count += 1
        for listener in self._listeners:
            listener(call)

    def run_started(self, run_id: str, thread: str, client: str) -> Run:
        """A run began (or resumed): kept, and updated in place as it goes."""
        run = Run(run_id, thread, client)
        self.runs.append(run)
        return run
