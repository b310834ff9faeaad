"""A stdio client's requests, one per line of the gateway's stdin, read by a daemon thread.

The SDK reads stdin through anyio's file wrapper: each line in a worker thread that a
cancellation has to wait for, and a blocked ``read`` can be neither interrupted nor left
behind (anyio's workers are not daemons). So a stop, SIGTERM or Ctrl-C, while the client
kept stdin open waited for the client's next line: for a terminal or a supervisor that
signals first, forever. Here a daemon thread reads a duplicate of fd 0 and hands each line
to the event loop, one at a time (it waits until the line is taken: a client that writes
faster than the gateway reads is held back, as by the pipe). Closing ``StdinLines`` stops the
hand-over; the thread, if blocked in its read, ends with the process. A read error ends the
input, as end of file does. A line longer than ``limit`` is read through, not held, and its
request refused (``refuse``), as an HTTP body over the same bound is; a line the SDK would
drop without a word (not JSON, a batch, an id it cannot answer: ``malformed``) is refused too.
Each refusal is one WARNING line. The end of input is told to the SDK only once every request
read is answered (or ``CALL_SHARE`` of the grace has passed): the SDK cancels the requests in
flight at its end of input, and a client that half-closed stdin after its last request
(``printf … | agent-gateway serve``) lost their answers, their upstream calls cancelled. Blank
lines are skipped, and a UTF-8 byte order mark that starts a line is dropped: JSON's RFC 8259
lets a parser ignore one, and a client whose writer is set up with .NET's ``Encoding.UTF8``
(which has a preamble) writes one before its first line. Read as part of the line, it made the
client's ``initialize`` a line that is not JSON, answered ``-32700`` to a null id: the client
waited for its answer until its own timeout.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from agent_gateway.body_shape import is_request, problem, too_long
from agent_gateway.downstream.malformed import Malformed, malformed, not_utf8, refusal, too_many_values
from agent_gateway.downstream.stdout import CALL_SHARE, WRITE_GRACE, InFlight
from agent_gateway.logs import clipped
from agent_gateway.refusals import refused
from agent_gateway.upstreams.stdio import request_id_of

logger = logging.getLogger(__name__)

_EDGE = 512
"""The last bytes of a line over the limit that are kept: where its id may be."""
_BOM = b"\xef\xbb\xbf"
"""U+FEFF, the byte order mark, in UTF-8."""

HANG_UP_CHECK = 1.0
"""Seconds between looks at whether the client closed its input, while its requests wait for
room: the end of input is read only after the lines before it, which are not read then."""

Refuse = Callable[[types.JSONRPCError], Awaitable[None]]
"""Sends the client an error answer."""


@dataclass(frozen=True)
class _TooLong:
    head: bytes
    tail: bytes
    size: int


class StdinLines:
    """The lines of ``fd`` (stdin by default), as text, for the SDK's stdio transport."""

    def __init__(self, limit: int, values: int, fd: int = 0, grace: float = WRITE_GRACE) -> None:
        self._limit = limit
        self._values = values
        self._fd = fd
        self.grace = grace
        """Seconds from the end of input until serving stops (``server.stdio_drain``)."""
        send, receive = anyio.create_memory_object_stream[bytes | _TooLong](0)
        self._send: MemoryObjectSendStream[bytes | _TooLong] = send
        self._receive: MemoryObjectReceiveStream[bytes | _TooLong] = receive
        self.refuse: Refuse | None = None
        """How a refused request is answered (set by the transport; None: not answered)."""
        self.in_flight = InFlight()
        """The requests read whose answers are not handed to stdout yet (released there)."""
        self.ended = anyio.Event()
        """Set at the end of the input."""

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
                self.ended.set()
                # The SDK cancels the requests in flight at the end it is told: not before they
                # are answered, or their share of the grace has passed.
                with anyio.move_on_after(self.grace * CALL_SHARE):
                    await self.in_flight.all_answered()
                raise StopAsyncIteration from None
            if isinstance(line, _TooLong):
                await self._too_long(line)
                continue
            line = line.removeprefix(_BOM)
            if (problem := too_many_values(line, self._values)) is not None:
                await self._malformed(problem, len(line))
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                await self._malformed(not_utf8(line), len(line))
                continue
            if not text.strip():
                continue  # nothing to read, nothing to answer
            if (problem := malformed(text) or await self._admitted(line)) is None:
                return text
            await self._malformed(problem, len(line))

    async def _admitted(self, line: bytes) -> Malformed | None:
        """Why a request is refused for its shape (as an HTTP body's is) or for an id already
        in flight; None once it is counted in flight (room waited for: ``stdout.InFlight``).
        A client's cancel releases nothing here: the SDK may answer its request still, and
        settles it (``stdout.SettlingStream``) if not."""
        message = msgspec.json.decode(line)  # JSON, as ``malformed`` found
        if not isinstance(message, dict) or not is_request(message):
            return None
        request_id = message["id"]
        if (found := problem(line, message)) is not None:
            answerable = not isinstance(request_id, str | int) or not too_long(request_id)
            return refusal(found[0], request_id if answerable else None, found[1])
        if request_id in self.in_flight:
            return refusal(f"a request with id {clipped(request_id)} is in flight already", request_id)
        while self.in_flight.full:
            with anyio.move_on_after(HANG_UP_CHECK):
                await self.in_flight.answer()
            if hung_up(self._fd):  # what it wrote and was not read yet will not be served
                self.ended.set()
        self.in_flight.add(request_id)
        return None

    async def _too_long(self, line: _TooLong) -> None:
        reason = f"request of {line.size} bytes is over server.max_body_bytes ({self._limit})"
        logger.warning("stdio: a %s: refused", reason)
        request_id = request_id_of(line.head, line.tail)
        if request_id is not None and self.refuse is not None:
            error = types.ErrorData(code=types.INVALID_REQUEST, message=reason)
            await self.refuse(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    async def _malformed(self, problem: Malformed, size: int) -> None:
        answered = "refused" if problem.answer is not None else "ignored"
        # The one client is the process that started the gateway: each kind of problem is its
        # own kind of line (repeats of one, once per ten seconds).
        refused(
            "body", "stdio: a line of %d bytes %s: %s", size, answered, problem.reason, peer=problem.reason
        )
        if problem.answer is not None and self.refuse is not None:
            await self.refuse(problem.answer)

    def _read(self, source: BinaryIO, token: anyio.lowlevel.EventLoopToken) -> None:
        """The thread: read lines until end of input, handing each to the loop; then end it."""
        with source:
            try:
                while line := source.readline(self._limit + 1):
                    if len(line) > self._limit and not line.endswith(b"\n"):
                        line = self._read_through(source, line)
                    anyio.from_thread.run(self._send.send, line, token=token)
            except OSError as exc:  # EIO from a terminal it lost, say: the input has ended
                logger.warning("stdio: reading stdin failed (%s): taken as its end", exc)
            except Exception:  # the loop stopped taking lines (closed, finished, cancelled): done
                return
        try:
            anyio.from_thread.run_sync(self._send.close, token=token)
        except Exception:  # the loop has finished already: nobody to tell
            return

    def _read_through(self, source: BinaryIO, head: bytes) -> _TooLong:
        """The rest of a line over the limit, read and dropped but for its last bytes."""
        size, tail = len(head), head[-_EDGE:]
        while not tail.endswith(b"\n") and (rest := source.readline(self._limit + 1)):
            size += len(rest)
            tail = (tail + rest)[-_EDGE:]
        return _TooLong(head, tail.rstrip(b"\r\n"), size)


def hung_up(fd: int) -> bool:
    """Whether the writer of the pipe ``fd`` reads has closed it (lines may be left unread)."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return any(events & select.POLLHUP for _, events in poll.poll(0))
