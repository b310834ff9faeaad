"""What a peer's stream sends that makes no message (blank lines, lines that do not parse, SSE
comments, events without data), counted the same way on every transport: past a bound within
a window with no message between, the stream is let go, saying why.

Before the bound, such noise was read until each call's timeout: an upstream's stream of SSE
comments took a third of a core and a bystander's p99 from 13 to 327 ms; 100,000 unparseable
stdio lines took 4.6 s of the gateway's CPU (each parsed, reported and dropped: ~46 us of the
event loop), an endless stream a fifth of a core for as long as it lasted; a WebSocket
upstream's 30-byte frames that are no JSON, 71 % of a core.

Counted here: the stdio transport's lines, the WebSocket transport's messages, and the bytes of
the HTTP transports' event streams (``compat/http_streams.quiet_events``: lines are not theirs
to count, only bytes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

QUIET_WINDOW = 10.0
"""Seconds from a stream's last message (or its start) within which its noise is bounded."""
QUIET_BYTES = 64 * 1024
"""Bytes that make no message a stream may send within ``QUIET_WINDOW``."""
QUIET_LINES = 1024
"""Lines (WebSocket messages) that make no message an upstream may send within ``QUIET_WINDOW``
(or ``QUIET_BYTES`` of them). A debugging server's stray line now and then is far below."""
START_ALLOWANCE = 16
"""How many times the bounds a stdio upstream may write before its first message: a banner,
its progress as it starts (~0.75 s of the event loop at most). Under the bounds themselves, a
server printing 2,000 lines of start-up to stdout before its answer to ``initialize`` was lost
at every start, never up; before any bound its lines were dropped and it served."""


class UpstreamNoise(Exception):
    """A stream sent noise past its bound within ``QUIET_WINDOW``."""


@dataclass
class QuietCount:
    """The noise since a stream's last message, in ``what`` (the stdio transport's lines, the
    WebSocket transport's messages; the HTTP transports count bytes only). The window starts
    at the last message: a message restarts it, as it forgives the noise before it (before,
    the window ran from the count's last reset, so the first flood after a quiet while was
    let through twice over)."""

    what: str = "lines (blank, or not JSON-RPC)"
    allowance: int = 1
    """The bounds' multiple until the first message (``START_ALLOWANCE`` for a stdio upstream)."""
    lines: int = 0
    size: int = 0
    since: float = field(default_factory=time.monotonic)

    def heard(self, lines: int, size: int, pending: int = 0) -> None:
        """Count ``lines`` of noise, ``size`` bytes in all; ``pending`` bytes of the noise so
        far may yet end as a message (an event not yet ended: a large message is not noise).

        Raises:
            UpstreamNoise: past the bound within ``QUIET_WINDOW``.
        """
        self.lines += lines
        self.size += size
        most_lines, most_bytes = QUIET_LINES * self.allowance, QUIET_BYTES * self.allowance
        if self.lines <= most_lines and self.size - pending <= most_bytes:
            return
        if time.monotonic() - self.since <= QUIET_WINDOW:
            raise UpstreamNoise(
                f"it sent over {most_lines} {self.what} or {most_bytes} bytes within "
                f"{QUIET_WINDOW:g} s that made no message"
            )
        # A window passed without a message: this noise starts the next one.
        self.lines, self.size, self.since = lines, size, time.monotonic()

    def message(self) -> None:
        """A message came: the noise before it is forgiven, and the window starts again."""
        self.lines = self.size = 0
        self.allowance = 1
        self.since = time.monotonic()
