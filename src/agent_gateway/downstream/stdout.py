"""A stdio client's answers: written to stdout by a daemon thread, and the requests a stdio
client has in flight, bounded until their answers are on their way.

The SDK writes stdout through anyio's file wrapper, each line in a worker thread that a
cancellation must wait for: a client that stopped reading its stdout (its pipe full) held
that thread, and with it the gateway, for ever: the gateway outlived the client's end of
input holding a gigabyte, its upstreams' processes running. And nothing held a client back
that wrote requests without reading the answers: each was served, its answer kept until
stdout took it (52,000 listings in 40 s: 2 GB). Here a daemon thread writes each line
handed to it (a hand-over a cancellation ends at once), and a request is read only while
fewer than ``MAX_IN_FLIGHT`` are unanswered, so such a client is held back by its own pipe,
as over HTTP by the connection's. fd 1 is diverted to stderr while the gateway serves, as
the SDK's transport does (a handler's stray print must not land on the wire), and restored.

A client that closes stdout (EPIPE: Python ignores SIGPIPE) reads no more answers, so it is
gone, as over HTTP a client whose connection closed: ``closed`` is set, and the gateway stops
serving it. Before, the gateway went on reading its requests and calling its upstreams for
answers nobody read (64 calls, then held by the bound in flight) for as long as the client kept
stdin open, a traceback on stderr from the writer's own flush.
"""

from __future__ import annotations

import contextvars
import fcntl
import logging
import os
import select
import threading
from functools import partial
from types import TracebackType

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from agent_gateway.compat.mcp import ReadStream, WriteStream
from agent_gateway.compat.streams import StreamWrapper

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Requests of a stdio client served at once, their answers not yet handed to stdout (as a
client's ``max_concurrency`` over HTTP): past it the next line is not read."""
WRITE_GRACE = 5.0
"""Seconds from the end of the client's input until serving stops, by default
(``server.stdio_drain``): for the requests in flight to be answered and their answers to
reach stdout."""
CALL_SHARE = 0.8
"""Of that grace, the share the requests in flight get to be answered (``stdin.StdinLines``
tells the SDK of the end only then); the SDK answers those left ``-32000 Connection closed``
in the time left (it gives each such write 1 s)."""


class InFlight:
    """The ids of the requests being served whose answers are not yet handed to stdout."""

    def __init__(self, bound: int = MAX_IN_FLIGHT) -> None:
        self._bound = bound
        self._ids: set[types.RequestId] = set()
        self._answered = anyio.Event()

    def __contains__(self, request_id: types.RequestId) -> bool:
        return request_id in self._ids

    @property
    def full(self) -> bool:
        return len(self._ids) >= self._bound

    async def answer(self) -> None:
        """Wait for the next answer handed to stdout."""
        await self._answered.wait()

    async def all_answered(self) -> None:
        """Wait until every request read has its answer handed to stdout."""
        while self._ids:
            await self.answer()

    def add(self, request_id: types.RequestId) -> None:
        self._ids.add(request_id)

    def answered(self, request_id: types.RequestId) -> None:
        """``request_id`` is answered (or settled unanswered: the SDK answers it no more)."""
        if request_id in self._ids:
            self._ids.discard(request_id)
            self._answered.set()
            self._answered = anyio.Event()

    async def settled(self, request_id: types.RequestId) -> None:
        """The SDK settled ``request_id`` with no answer (its client cancelled it in time)."""
        self.answered(request_id)


class AnsweringStream(StreamWrapper[WriteStream[SessionMessage]]):
    """The low-level server's write stream: each answer handed on releases its request."""

    def __init__(self, inner: WriteStream[SessionMessage], in_flight: InFlight) -> None:
        self._inner = inner
        self._in_flight = in_flight

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(item)
        message = item.message
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id is not None:
            self._in_flight.answered(message.id)


class SettlingStream(StreamWrapper[ReadStream[SessionMessage | Exception]]):
    """The low-level server's read stream: each request told to release its place in flight
    if the SDK settles it with no answer. A client's cancel is not itself a release: the SDK
    ignores one that comes once the handler has returned, and answers the request all the
    same. Released at the cancel, a client writing each request with its cancel and reading
    no answers was read without end (20,000 listings: 163 to 613 MB in 16 s)."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], in_flight: InFlight) -> None:
        self._inner = inner
        self._in_flight = in_flight

    @property
    def last_context(self) -> contextvars.Context | None:
        """The sender's context, which the SDK's dispatcher reads off its read stream."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        item = await self._inner.receive()
        # stdio's transport stamps no metadata on what it reads: one it did is left alone.
        if (
            isinstance(item, SessionMessage)
            and isinstance(item.message, types.JSONRPCRequest)
            and item.metadata is None
        ):
            settled = partial(self._in_flight.settled, item.message.id)
            item.metadata = ServerMessageMetadata(on_request_unanswered=settled)
        return item

    def __aiter__(self) -> SettlingStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class StdoutLines:
    """What the SDK's stdio transport writes to stdout (``write``, ``flush``), written by a
    daemon thread to a duplicate of fd 1, fd 1 itself pointed at stderr meanwhile."""

    def __init__(self, fd: int = 1, grace: float = WRITE_GRACE) -> None:
        self._fd = fd
        self._grace = grace
        send, receive = anyio.create_memory_object_stream[bytes](0)
        self._send: MemoryObjectSendStream[bytes] = send
        self._receive: MemoryObjectReceiveStream[bytes] = receive
        self._written = anyio.Event()
        self._wire = -1
        self._handed = 0
        self._done = 0  # lines the thread has written whole; behind ``_handed`` while one is on its way
        self.closed = anyio.Event()
        """Set when stdout cannot be written (the client closed it): nobody reads the answers."""

    async def __aenter__(self) -> StdoutLines:
        self._wire = fcntl.fcntl(self._fd, fcntl.F_DUPFD_CLOEXEC, 3)
        os.dup2(2, self._fd)
        token = anyio.lowlevel.current_token()
        threading.Thread(target=self._write_lines, args=(token,), name="stdout", daemon=True).start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._send.close()
        if self._done < self._handed:
            logger.info(
                "stdio: serving ended, an answer still being written: the client has %g s to take it",
                self._grace,
            )
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._grace):
            await self._written.wait()  # what was handed over is written, or the client reads no more
        self._receive.close()
        os.dup2(self._wire, self._fd)
        if self._written.is_set():  # else the thread, blocked in its write, ends with the process
            os.close(self._wire)

    async def write(self, text: str) -> None:
        try:
            await self._send.send(text.encode())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # stdout is gone (the client closed it): nobody reads the answer
        self._handed += 1

    async def flush(self) -> None:
        """Each line is flushed as it is written."""

    def _write_lines(self, token: anyio.lowlevel.EventLoopToken) -> None:
        """The thread: write each line handed over until the hand-over ends or stdout fails."""
        failed = False
        try:
            while True:
                _write_all(self._wire, anyio.from_thread.run(self._receive.receive, token=token))
                self._done += 1
        except OSError as exc:  # EPIPE: the client closed its end
            logger.warning("stdio: writing stdout failed (%s): the client reads no more answers", exc)
            failed = True
        except Exception:  # the hand-over ended (closed, finished, cancelled): done
            logger.debug("stdio: stdout's writer done")
        try:
            anyio.from_thread.run_sync(self._ended, failed, token=token)
        except Exception:  # the loop has finished already: nobody to tell
            return

    def _ended(self, failed: bool) -> None:
        self._written.set()
        self._receive.close()  # a write handed over from now is dropped, not waited on
        if failed:
            self.closed.set()


def _write_all(fd: int, data: bytes) -> None:
    """``data`` written whole to ``fd`` (unbuffered: nothing is left to flush, or to fail in a
    flush, once a write has failed); a non-blocking pipe that is full is waited for."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            _until_writable(fd)


def _until_writable(fd: int) -> None:
    """Until ``fd`` drains, or fails (POLLERR: the next write raises EPIPE). ``poll``, not
    ``select``, which fails on a descriptor past 1023."""
    waiting = select.poll()
    waiting.register(fd, select.POLLOUT)
    waiting.poll()
