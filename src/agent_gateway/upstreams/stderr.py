"""What a stdio upstream writes to its stderr, passed on as the gateway's own log lines.

The child used to write to the gateway's stderr itself: past every filter of the gateway's
log (its JSON format, its clipping, its trace ids), unbounded, and with whatever it printed,
its own credentials included (an upstream that printed its environment put its token in the
gateway's log). Now each line is read here and logged as ``upstream NAME stderr: …``: cut to
the log's ``CLIP`` characters (saying how long it was), the upstream's configured secrets
taken out (``logs.scrubbed``), at most ``RATE`` lines a second (the rest counted, the count
written with the next line passed on). The pipe is always drained at once, so a child never
blocks on its stderr.
"""

from __future__ import annotations

import logging
import math
from contextlib import suppress

import anyio
from anyio.abc import ByteReceiveStream

from agent_gateway.logs import CLIP, scrubbed
from agent_gateway.token_bucket import TokenBucket

logger = logging.getLogger(__name__)

RATE = 100
"""Lines a second passed on from one upstream process (as many at once)."""
_UNENDED = 1 << 16
"""Bytes of a line without its end held before what there is of it is passed on."""


_QUIET = 1.0
"""Seconds of a quiet stderr after which the count of lines left out is passed on alone."""


class StderrLines:
    """One process's stderr, split into lines and passed on within ``RATE``."""

    def __init__(self, label: str, secrets: tuple[str, ...]) -> None:
        self._label = label
        self._secrets = secrets
        self._bucket = TokenBucket(RATE, RATE)
        self._partial = b""
        self._left_out = 0

    async def pass_on(self, stream: ByteReceiveStream) -> None:
        """Read ``stream`` to its end (the process's, or the cancellation of its transport), or
        until it is closed under the read: at the stop, when a process that left the group (a
        daemon) still holds it. That ended the transport, and the upstream was down for
        "ClosedResourceError: ClosedResourceError" instead of its session's reason. Lines
        left out are counted on the next line passed on, or on a line of their own once the
        stream has been quiet for ``_QUIET`` seconds (a burst read whole has no next line), or
        when the reading ends, cancelled included: the transport's stop cancels it, and a
        burst read within ``_QUIET`` of the stop lost its count."""
        try:
            with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                while True:
                    with anyio.move_on_after(_QUIET if self._left_out else math.inf) as quiet:
                        self.feed(await stream.receive())
                    if quiet.cancelled_caught:
                        self._count_left_out()
        finally:  # no awaiting here: logging only
            if self._partial:
                self._line(self._partial)
            self._count_left_out()

    def _count_left_out(self) -> None:
        if self._left_out:
            logger.info(
                "upstream %s stderr: (%d lines before it left out: over %d a second)",
                self._label,
                self._left_out,
                RATE,
            )
            self._left_out = 0

    def feed(self, chunk: bytes) -> None:
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > _UNENDED:  # a line without end: passed on as far as it goes
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if self._bucket.take() is not None:
            self._left_out += 1
            return
        text = line.decode("utf-8", "replace").rstrip("\r")
        notes = f"… ({len(text):,} characters, cut)" if len(text) > CLIP else ""
        if self._left_out:
            notes += f" ({self._left_out} lines before it left out: over {RATE} a second)"
            self._left_out = 0
        # Each argument within CLIP: the log would cut the notes off a longer one.
        logger.info("upstream %s stderr: %s%s", self._label, scrubbed(text[:CLIP], self._secrets), notes)
