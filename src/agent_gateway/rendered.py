"""A page (or part of one) any client may ask for as often as it likes, rendered at most once
every ``PAGE_INTERVAL``: ``/status``, ``/metrics`` and the status page's live sections."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

PAGE_INTERVAL = 1.0
"""Seconds one rendering is served for. A rendering is loop time every client waits for
(``/metrics`` ~6 ms, ``/status`` ~1 ms, the status page's catalog most of a second at 10,000
tools), and none is rate limited: polled flat out, each cost everyone's calls a hundredfold.
A scraper polls every 15 s and a person reloads, so a page at most this old is as good to them."""

T = TypeVar("T")


class Rendered(Generic[T]):
    """What ``render`` makes, made again only once the last rendering is ``PAGE_INTERVAL``
    old: however many clients ask, it costs the loop one rendering a second."""

    def __init__(self, name: str, render: Callable[[], T]) -> None:
        """``name``: what its DEBUG line calls it (``/status rendered in 0.6 ms``)."""
        self.name = name
        self._render = render
        self._last: tuple[float, T] | None = None

    def value(self) -> T:
        now = time.monotonic()
        if self._last is None or now - self._last[0] >= PAGE_INTERVAL:
            self._last = (now, self._render())
            logger.debug("%s rendered in %.1f ms", self.name, (time.monotonic() - now) * 1000)
        return self._last[1]
