"""What an upstream's connection sends that makes no message (blank lines, lines that do not
parse), counted: past a bound within a window its session is lost, saying why.

The Streamable HTTP and legacy SSE transports count their streams' noise in bytes
(``compat/http_streams.quiet_events``); a stdio upstream's costs by the line too: each
unparseable line is parsed, reported and dropped (~46 us of the event loop), and 100,000 of
them took 4.6 s of the gateway's CPU, an endless stream a core's fifth for as long as it
lasted, while the call it answered waited its whole timeout. A WebSocket upstream's
messages that do not parse, each in a frame of 32 bytes (under the bound of frames a read),
took 71 % of a core until the call's timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent_gateway.compat.http_streams import QUIET_BYTES, QUIET_WINDOW

QUIET_LINES = 1024
"""Lines (WebSocket messages) that make no message an upstream may send within ``QUIET_WINDOW`` (or ``QUIET_BYTES``
of them) before its session is lost. A debugging server's stray line now and then is far below."""
START_LINES = 16 * QUIET_LINES
START_BYTES = 16 * QUIET_BYTES
"""What a stdio upstream may write that makes no message before its first message: a banner,
its progress as it starts (~0.75 s of the event loop at most). Under the bound above, a server
printing 2,000 lines of start-up to stdout before its answer to ``initialize`` was lost at
every start, never up; before any bound its lines were dropped and it served."""


class UpstreamNoise(Exception):
    """An upstream's connection sent noise past ``QUIET_LINES`` or ``QUIET_BYTES``."""


@dataclass
class QuietCount:
    """The noise since the last message (the window restarted once it is passed), in ``what``:
    the stdio transport's lines, the WebSocket transport's messages."""

    what: str = "lines (blank, or not JSON-RPC)"
    started: bool = True
    """Whether a message came yet: before, ``START_LINES`` and ``START_BYTES`` are the bound."""
    lines: int = 0
    size: int = 0
    since: float = field(default_factory=time.monotonic)

    def heard(self, lines: int, size: int) -> None:
        """Count ``lines`` of noise, ``size`` bytes in all.

        Raises:
            UpstreamNoise: past the bound within ``QUIET_WINDOW``.
        """
        self.lines += lines
        self.size += size
        most_lines, most_bytes = (QUIET_LINES, QUIET_BYTES) if self.started else (START_LINES, START_BYTES)
        if self.lines <= most_lines and self.size <= most_bytes:
            return
        if time.monotonic() - self.since <= QUIET_WINDOW:
            raise UpstreamNoise(
                f"it sent over {most_lines} {self.what} or {most_bytes} bytes within "
                f"{QUIET_WINDOW:g} s that made no message"
            )
        self.lines, self.size, self.since = 0, 0, time.monotonic()

    def message(self) -> None:
        """A message came: the noise before it is forgiven."""
        self.lines = self.size = 0
        self.started = True
