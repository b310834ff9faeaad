"""A stdio client's requests, one per line of the gateway's stdin, read by a daemon thread.

The SDK reads stdin through anyio's file wrapper: each line in a worker thread that a
cancellation has to wait for, and a blocked ``read`` can be neither interrupted nor left
behind (anyio's workers are not daemons). So a stop, SIGTERM or Ctrl-C, while the client
kept stdin open waited for the client's next line: for a terminal or a supervisor that
signals first, forever. Here a daemon thread reads a duplicate of fd 0 and hands each line
to the event loop, one at a time (it waits until the line is taken: a client that writes
faster than the gateway reads is held back, as by the pipe). Closing ``StdinLines`` stops the
hand-over; the thread, if blocked in its read, ends with the process. A line longer than
``limit`` is read through and dropped, logged, as an HTTP body over the same bound is refused.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType
from typing import BinaryIO

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

logger = logging.getLogger(__name__)


class StdinLines:
    """The lines of ``fd`` (stdin by default), as text, for the SDK's stdio transport."""

    def __init__(self, limit: int, fd: int = 0) -> None:
        self._limit = limit
        self._fd = fd
        send, receive = anyio.create_memory_object_stream[bytes](0)
        self._send: MemoryObjectSendStream[bytes] = send
        self._receive: MemoryObjectReceiveStream[bytes] = receive

    async def __aenter__(self) -> StdinLines:
        source = os.fdopen(os.dup(self._fd), "rb")  # a duplicate: nothing closes it under the thread
        token = anyio.lowlevel.current_token()
        threading.Thread(target=self._read, args=(source, token), name="stdin", daemon=True).start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A hand-over waiting now fails, and the thread ends with it (or, blocked in its
        # read, with the process).
        self._send.close()
        self._receive.close()

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self._receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise StopAsyncIteration from None
            if line:  # empty: a line over the limit, dropped
                return line.decode("utf-8", errors="replace")

    def _read(self, source: BinaryIO, token: anyio.lowlevel.EventLoopToken) -> None:
        """The thread: read lines until end of input, or until the loop stops taking them."""
        try:
            with source:
                while line := source.readline(self._limit + 1):
                    if len(line) > self._limit and not line.endswith(b"\n"):
                        line = self._skipped(source, len(line))
                    anyio.from_thread.run(self._send.send, line, token=token)
            anyio.from_thread.run_sync(self._send.close, token=token)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.RunFinishedError, OSError):
            return  # the gateway stopped reading (or its loop has ended): nothing more to hand over

    def _skipped(self, source: BinaryIO, size: int) -> bytes:
        while (rest := source.readline(self._limit + 1)) and not rest.endswith(b"\n"):
            size += len(rest)
        logger.warning(
            "stdio: a request line of %d bytes is over server.max_body_bytes (%d): dropped",
            size + len(rest),
            self._limit,
        )
        return b""
