"""A token bucket: the one rate bound the gateway keeps, for a client's requests and agent runs
(``access.py``), an upstream's notifications (``upstreams/pace.py``) and the log lines no call
owns passed on to every client (``downstream/broadcast.py``); and its kin in bytes, for the
status page's answers to a client (``page_budget.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent_gateway.config_auth import RateLimit

Clock = Callable[[], float]


class TokenBucket:
    """``per_second`` tokens a second, holding at most ``burst``; each use takes one."""

    def __init__(self, per_second: float, burst: float, clock: Clock = time.monotonic) -> None:
        self._rate = per_second
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._at = clock()

    @classmethod
    def of(cls, limit: RateLimit, clock: Clock = time.monotonic) -> TokenBucket:
        """The bucket a client's ``rate_limit`` sets (``per_minute``, ``burst``)."""
        return cls(limit.per_minute / 60.0, limit.burst, clock)

    def take(self) -> float | None:
        """Take one token; None if taken, else the seconds until one is there."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / self._rate


class ByteBudget:
    """``per_second`` bytes a second, holding at most ``burst``; an answer is let through while
    something is left, and may take the budget below nothing (the client then waits it out)."""

    def __init__(self, per_second: float, burst: float, clock: Clock = time.monotonic) -> None:
        self._rate = per_second
        self._burst = burst
        self._left = burst
        self._clock = clock
        self._at = clock()

    def wait(self) -> float | None:
        """None if something is left to spend, else the seconds until something is."""
        self._refill()
        return None if self._left > 0 else (1 - self._left) / self._rate

    def spend(self, size: int) -> None:
        """Spend ``size`` bytes, what is left going below nothing if it must."""
        self._refill()
        self._left -= size

    def full(self) -> bool:
        """Whether nothing has been spent that is not refilled (forgetting it loses nothing)."""
        self._refill()
        return self._left >= self._burst

    def _refill(self) -> None:
        now = self._clock()
        self._left = min(self._burst, self._left + (now - self._at) * self._rate)
        self._at = now
