"""How many of a WebSocket upstream's pings the gateway answers.

Each ping is answered with a pong on the event loop, inside the read that brought it: an
upstream sending them flat out (600,000 empty pings) held every other client's calls for
seconds, and one that stopped reading while it pinged had its pongs pile up in the gateway's
memory (2M pings: 404 MB). A well-behaved peer pings every few seconds at most, so past either
bound the connection is closed (1008, saying which bound) and the session reconnected with
its usual backoff (``compat/websockets.py`` does the closing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent_gateway.token_bucket import TokenBucket

PINGS_PER_SECOND = 100
"""Pings answered a second (as many at once): keepalives come every few seconds."""
UNWRITTEN_PONG_BYTES = 64 * 2**10
"""Bytes of pongs queued while the connection's write buffer was never empty: an upstream
that pings but does not read its pongs is past this within seconds at the rate above, after
the kernel's own socket buffers (which bound themselves) are full."""
_PONG_HEAD = 6
"""A client's pong frame past its payload: two bytes of header and four of mask."""


@dataclass(frozen=True, slots=True)
class PingBounds:
    per_second: float = PINGS_PER_SECOND
    unwritten: int = UNWRITTEN_PONG_BYTES


class Pings:
    """One connection's pings: each answered while within ``bounds``; ``unwritten`` reads the
    bytes the connection's socket has not yet written."""

    def __init__(self, bounds: PingBounds, unwritten: Callable[[], int]) -> None:
        self._bounds = bounds
        self._bucket = TokenBucket(bounds.per_second, bounds.per_second)
        self._unwritten = unwritten
        self._pongs = 0
        """Bytes of pongs queued since the write buffer was last seen empty."""

    def refusal(self, size: int) -> str | None:
        """Why a ping of ``size`` bytes is not answered (the close frame's reason), or None."""
        if self._bucket.take() is not None:
            return f"over {self._bounds.per_second:g} pings a second"
        if self._unwritten() == 0:  # what was queued before has reached the socket
            self._pongs = 0
        self._pongs += size + _PONG_HEAD
        if self._pongs > self._bounds.unwritten:
            return f"over {self._bounds.unwritten} bytes of pongs unread"
        return None


PINGS = PingBounds()
"""Every WebSocket upstream's."""
