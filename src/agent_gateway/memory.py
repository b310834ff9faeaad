"""Memory a large answer used, given back to the system once it is let go.

glibc's malloc keeps what a process frees for its next allocations: after one 80 MB answer
(read, parsed, serialised, written, let go) the gateway stayed over 100 MB larger than before
it (``bench/attack.py big-results``), for good. ``malloc_trim`` hands the free pages of every
arena back. It walks them (about 6 ms at a 500 MB heap, on the event loop), so it runs at
most once per ``DELAY``, that long after an answer of ``LARGE`` bytes or more was let go
(``in_flight.InFlight.give``): a burst of large answers costs one walk. Where the C library
has no ``malloc_trim`` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

LARGE = 8 * 2**20
"""An answer this large (bytes) leaves enough freed behind to be worth a walk."""
DELAY = 1.0
"""Seconds from a large answer let go to the walk (and between two walks)."""


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def _resident() -> int:
    """The process's resident bytes (0 where /proc has no statm)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Trimmer:
    """Gives freed memory back a while after a large answer is let go."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._due: asyncio.TimerHandle | None = None
        self._due_in: asyncio.AbstractEventLoop | None = None
        self.trims = 0

    def after_large(self) -> None:
        """A large answer was let go: give its memory back within ``DELAY``."""
        if self._trim is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a test calling directly): nothing to schedule on
            return
        if self._due is not None and self._due_in is loop:
            return  # one is due already (one due on a loop since closed never runs: forgotten)
        self._due, self._due_in = loop.call_later(DELAY, self._run), loop

    def _run(self) -> None:
        assert self._trim is not None
        self._due = None
        before, started = _resident(), time.perf_counter()
        self._trim(0)
        self.trims += 1
        freed = max(0, before - _resident())
        took = (time.perf_counter() - started) * 1000
        logger.debug("gave %.0f MB of freed memory back to the system in %.1f ms", freed / 2**20, took)


TRIMMER = Trimmer()
"""The process's (memory is the process's)."""
