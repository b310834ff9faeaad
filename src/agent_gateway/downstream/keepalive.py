"""One task that tells each silent call when it has been silent too long.

A handshake-era call answered in its POST's own task (``compat/lane.py``) keeps its answer
waiting until its result, so that the result can go back as one JSON body. After
``interval`` of silence the answer becomes an SSE stream with a keepalive first, as the
SDK's own stream would ping, so a client's read timeout does not cut a long call. A task
per call to wait out the interval cost as much CPU as the lane saved; here one task waits
for all of them. Calls start in order, so their deadlines are in order too: a queue, looked
at once per ``slack`` at most, whatever the call rate. A modern-era call's watch for its
client hanging up (``compat/exchange.py``) is started the same way, after a shorter interval.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import anyio

logger = logging.getLogger(__name__)

_SLACK = 1.0
"""Seconds by which a silent call's turn may come early, by default: calls due within it are
told at once."""


@dataclass(slots=True)
class Watch:
    """One call's place in the queue, until its deadline. ``end`` it when the call has
    answered: it is then skipped, and holds nothing of the call meanwhile."""

    deadline: float
    on_silence: Callable[[], None] | None

    def end(self) -> None:
        self.on_silence = None


class Keepalive:
    """Tells each watched call once it has been silent for ``interval`` seconds. Run ``run``
    in a task group for as long as calls are served."""

    def __init__(self, interval: float, slack: float = _SLACK) -> None:
        self.interval = interval
        self._slack = slack
        self._due: deque[Watch] = deque()
        self._arrived: anyio.Event | None = None
        """Set when a call is watched while the queue is empty (made by ``run``)."""

    def watch(self, on_silence: Callable[[], None]) -> Watch:
        """Call ``on_silence`` (from the task running ``run``) after ``interval``, unless the
        returned watch is ended first."""
        if not self._due and self._arrived is not None:
            self._arrived.set()
        watch = Watch(time.monotonic() + self.interval, on_silence)
        self._due.append(watch)
        return watch

    async def run(self) -> None:
        while True:
            if not self._due:
                self._arrived = anyio.Event()
                await self._arrived.wait()
            await anyio.sleep(max(0.0, self._due[0].deadline - time.monotonic()))
            horizon = time.monotonic() + self._slack
            while self._due and self._due[0].deadline <= horizon:
                watch = self._due.popleft()
                if (on_silence := watch.on_silence) is not None:
                    watch.end()
                    try:
                        on_silence()
                    except Exception:  # one call's failure ends neither the others' watch nor the server
                        logger.exception("a silent call could not be told")
