"""The websockets library's client connection, its answers to pings checked first, and its
socket dropped once a close is under way and the upstream has not ended it (verified against
websockets 17.4, the asyncio implementation).

The library answers a ping inside the read callback that parsed it: its Sans-I/O protocol's
``recv_frame`` queues a pong for each PING frame, and ``data_received`` parses a whole read
before it returns. One 256 KiB read holds ~131,000 empty pings (over a second of the event
loop for every client), and the pongs an upstream does not read pile up in the write buffer
(2M pings: 135 to 539 MB). No option bounds either, so ``checking_pings`` gives ``connect``
(through its public ``create_connection``) a connection whose protocol asks a check before
each answer; refused, the connection is failed as the library fails it on a protocol error:
a close frame (1008, the check's reason), the rest of what was read discarded unparsed.

Once a read leaves a close under way (the upstream's close frame, or the library failing the
connection for what it read: a bad close code, a frame over ``max_size``, reserved bits set)
the protocol expects the upstream to close the TCP connection, and asks its user to drop it
after a short timeout if it does not (``close_expected``). The asyncio connection only notes
the deadline there: nothing acted on it until its next write, its keepalive ping 20 s later,
and until then ``recv`` waited, and the calls in flight with it (an upstream that sent
``1005`` on the wire and kept its socket open failed a call after 19 s). Here the socket is
dropped ``close_timeout`` after such a read if the upstream has not closed it by then.

Every frame of a read is parsed in that one callback, and the library's own bound on a
message's fragments (4,096) is checked only once they are parsed and queued: one 256 KiB read
of 1-byte fragments or empty messages is ~87,000 to 131,000 frames, 0.4 to 1.5 s of the
event loop for every client (and 2M empty messages went on for as long as they came, the call
waiting its timeout). No MCP message in a frame of its own is under 32 bytes, so past
``FRAMES_PER_READ`` frames in one read the connection is failed as for a refused ping (1008),
the rest of the read discarded unparsed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import CLOSED

PingCheck = Callable[[int], str | None]
"""Told each ping's payload size: the reason to refuse it (at most 123 bytes: a close frame's
room), or None to answer it."""
CheckFor = Callable[[Callable[[], int]], PingCheck]
"""Makes one connection's check, given how to read the bytes its socket has not yet written."""
FRAMES_PER_READ = 8192
"""Frames parsed from one read: asyncio's reads are of 256 KiB at most, so 32 bytes a frame, the
size of the smallest JSON-RPC message (a notification of a one-letter method) in a frame of
its own; ~60 ms of the event loop."""


class _Read:
    """How many frames the read being parsed has held so far."""

    frames = 0


def checking_pings(check_for: CheckFor) -> type[ClientConnection]:
    """A ``ClientConnection`` class whose every connection answers pings only while the check
    ``check_for`` makes for it says so, and drops its socket once a close the upstream does
    not finish has had ``close_timeout``."""

    class Checked(ClientConnection):
        def __init__(self, protocol: ClientProtocol, **options: Any) -> None:
            super().__init__(protocol, **options)
            self._dropping: asyncio.TimerHandle | None = None
            self._read = _Read()
            _check_frames(protocol, check_for(self._unwritten), self._read)

        def _unwritten(self) -> int:
            return self.transport.get_write_buffer_size()

        def data_received(self, data: bytes) -> None:
            self._read.frames = 0
            super().data_received(data)
            # A close under way (the upstream's, or the library's for what it read, a refused
            # ping's included): an upstream that neither finishes it nor closes is dropped
            # once the close may take no longer.
            if self._dropping is None and self.protocol.close_expected():
                self._dropping = self.loop.call_later(self.close_timeout or 0.0, self._drop)

        def _drop(self) -> None:
            if self.protocol.state is not CLOSED:
                self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._dropping is not None:
                self._dropping.cancel()
            super().connection_lost(exc)

    return Checked


def _check_frames(protocol: ClientProtocol, check: PingCheck, read: _Read) -> None:
    """Count each frame of ``read``, and ask ``check`` before ``protocol`` answers a ping.
    Set on the instance: ``connect`` builds the protocol itself, of its own class."""
    answer = protocol.recv_frame

    def recv_frame(frame: Frame) -> None:
        read.frames += 1
        reason = f"over {FRAMES_PER_READ} frames in one read" if read.frames > FRAMES_PER_READ else None
        if reason is None and frame.opcode is Opcode.PING:
            reason = check(len(frame.data))
        if reason is not None:
            # As recv_frame's own close handling does: the parser is replaced (by fail) with
            # one that discards the rest of the read, so no further frame of it is parsed.
            protocol.fail(CloseCode.POLICY_VIOLATION, reason)
            return
        answer(frame)

    protocol.recv_frame = recv_frame  # pyright: ignore[reportAttributeAccessIssue]
