"""How long an upstream waits between connection attempts: exponential, with full jitter,
started over only after a connection that held.

Started over at every connection that answered ``initialize`` and its listing, an upstream
that then dropped at once (a crash after start-up, a proxy that cuts idle streams) was
reconnected twice a second for as long as it did so, each round logged, and with
``failure_mode: hide`` each round told every client its tools changed twice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

STEADY = 10.0
"""Seconds a connection holds before the next failure's wait starts from the first delay."""


@dataclass(slots=True)
class Backoff:
    """The delays before an upstream's connection attempts."""

    initial: float = 0.5
    maximum: float = 30.0
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2**self.attempt)
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def held(self, seconds: float) -> None:
        """A connection ended after ``seconds`` up: one that held ``STEADY`` starts the delays over."""
        if seconds >= STEADY:
            self.attempt = 0
