"""The serving process itself: its event loop, its garbage collector, its libraries' log lines.

``agent-gateway serve`` is a long-lived process whose every call allocates and frees a few
thousand objects, on a heap that imports LangChain, LangGraph, pydantic schemas and the MCP
stack (about 190,000 objects once started). With CPython's default thresholds the
collector walks that whole heap several times a second under load: a quarter of the
gateway's CPU per call in ``bench/overhead.py``, and a quarter of a 10,000-tool start-up.
So the imported heap is frozen before the upstreams connect, and what start-up built is
collected once and frozen too once it is up (never scanned again: it lives as long as the
process; a frozen object that later becomes cyclic garbage is not reclaimed, which bounds
that loss by the start-up heap); from the start the youngest generation is collected every
``GEN0_THRESHOLD`` allocations instead of 700.
The older generations keep CPython's ratios of 10, so cyclic garbage made while serving
(ended sessions, tracebacks) is still reclaimed, by a full pass every ~5 million
allocations (seconds, under load), over the objects made since start-up only. The event
loop is uvloop where it is installed (a dependency on Linux and macOS): a further tenth off
each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import importlib.util
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Self, TypeVar, TypeVarTuple, Unpack

import anyio
from anyio.abc import TaskGroup

SEND_TIMEOUT = 5.0
"""The longest one message outside a call may take to leave (a notification or log line to a
client, a level or subscription change to an upstream): a stuck peer is skipped, not waited
for, and whoever sent it goes on."""

CLEANUP_TIMEOUT = 5.0
"""The longest a shielded cleanup may take (a client, a file, a store, a session or a task
closed or ended): a stuck one is given up on, and whatever was stopping goes on."""

T = TypeVar("T")
Args = TypeVarTuple("Args")

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 10
GEN2_THRESHOLD = 10

CHATTY_LOGGERS = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "fastmcp.server.auth.middleware",
    "fastmcp.server.auth.providers.jwt",
)
"""Libraries that log every HTTP request at INFO: one line per upstream call (FastMCP's auth:
one per request refused 401, and one per expired JWT, which a client sends as fast as it likes)."""

logger = logging.getLogger(__name__)


class TaskHost:
    """Owns tasks that serve only while it runs: ``_tg`` is their group inside ``running``
    (None outside it, so a start then is refused), and they are cancelled on its way out."""

    _tg: TaskGroup | None = None

    def start_soon(
        self, work: Callable[[Unpack[Args]], Coroutine[Any, Any, Any]], *args: *Args, name: str
    ) -> bool:
        """Run ``work`` in this host's group: whether it was started (not while it is stopped)."""
        if self._tg is None:
            return False
        self._tg.start_soon(work, *args, name=name)
        return True

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Self]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                self._tg = None
                tg.cancel_scope.cancel()


_frozen_objects = 0
"""How many objects the last freeze left frozen: ``gc.get_freeze_count()`` walks the frozen
generation, ~24 ms of loop time for a started gateway's heap on every ``/status``."""


def has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def run(main: Callable[[Unpack[Args]], Awaitable[T]], *args: *Args) -> T:
    """``anyio.run(main, *args)`` on uvloop when it is installed, else asyncio's own loop."""
    return anyio.run(main, *args, backend_options={"use_uvloop": has_uvloop()})


def prepare_heap() -> None:
    """Freeze what the imports built, and collect the young generation in larger batches.

    Call before start-up connects the upstreams. Start-up then builds the catalog: hundreds
    of thousands of objects that live as long as the process (10,000 tools: ~370,000). With
    CPython's default thresholds the collector walked that growing heap, imports included,
    a thousand times and in full eight times: 1.4 s of a 10,000-tool start-up's 5.3 s of CPU.
    """
    _freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


def settle_heap() -> None:
    """Collect once, then freeze what start-up built (after :func:`prepare_heap`).

    Call once the gateway is up (upstreams connected, catalog built).
    """
    gc.collect()
    _freeze()
    logger.debug("heap settled: %d objects frozen", _frozen_objects)


def _freeze() -> None:
    global _frozen_objects
    gc.freeze()
    _frozen_objects = gc.get_freeze_count()  # counted once here, not on every /status


@asynccontextmanager
async def importing(module: str | None) -> AsyncIterator[anyio.Event]:
    """Import ``module`` in a worker thread while the body runs; the event is set once it is
    (at once for None: nothing to import).

    For a library the gateway needs only once it is up (the agent's LangChain and LangGraph,
    ~0.5 s of CPU): imported while the upstreams connect, when the event loop mostly waits on
    them, it costs the start-up little wall time. The body's end waits for the import (a
    thread cannot be cancelled; an import is bounded by itself).
    """
    imported = anyio.Event()
    if module is None:
        imported.set()
        yield imported
        return

    async def load() -> None:
        await anyio.to_thread.run_sync(importlib.import_module, module)
        imported.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(load, name=f"import {module}")
        yield imported


def describe() -> dict[str, object]:
    """This process's loop and collector settings, for ``/status`` (call inside the loop)."""
    return {
        "event_loop": type(asyncio.get_running_loop()).__module__.partition(".")[0],
        "gc_thresholds": list(gc.get_threshold()),
        "gc_frozen_objects": _frozen_objects,
    }


def quiet_libraries(level: int) -> None:
    """Per-request lines from the HTTP client libraries only at DEBUG (``--log-level debug``),
    and FastMCP's lines through the gateway's own handler."""
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    # FastMCP gives its loggers a Rich handler of their own at import, not propagating: their
    # lines missed the gateway's filters (clipped, escaped, a peer's repeats counted, trace
    # ids, JSON), cost 1 ms of CPU each, and a token's 20,000-character subject was word-wrapped
    # for 2.6 s on the event loop. Through the gateway's handler, as every other library's.
    fastmcp = logging.getLogger("fastmcp")
    for handler in fastmcp.handlers[:]:
        fastmcp.removeHandler(handler)
    fastmcp.propagate = True
    fastmcp.setLevel(logging.NOTSET)


def child_pids() -> list[int]:
    """This process's live child processes (Linux ``/proc``; empty where it is absent)."""
    pids: list[int] = []
    for path in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in path.read_text().split()]
    return pids
