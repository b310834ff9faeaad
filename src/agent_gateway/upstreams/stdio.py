"""The stdio transport to a child-process upstream, with a line reader linear in the line's size.

``mcp.client.stdio.stdio_client`` joins its carried-over text to each new 64 KiB chunk and
splits the whole string again, so one long line costs time quadratic in its length: a 50 MB
tool result (100 MB of JSON with its structured copy) took 70 s, all of it on the event
loop, stalling every other client of the gateway. This reader keeps the pieces of an
unfinished line in a list and joins them once, when its newline arrives (about 1 s for the
same result).

The process (spawned, watched, stopped: ``stdio_process.py``) is told of when its stdout
ends: the session is lost saying how (``the process exited with code 3``, ``… was killed by
SIGKILL``, ``… closed its stdout``), and the calls failed with it say so too. On Windows the
SDK's own transport is used as it is.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import NamedTuple

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.message import SessionMessage

from agent_gateway.compat.mcp import TransportStreams, Unreadable, parse_message
from agent_gateway.in_flight import IN_FLIGHT
from agent_gateway.noise import START_ALLOWANCE, QuietCount, UpstreamNoise
from agent_gateway.upstreams.stderr import StderrLines
from agent_gateway.upstreams.stdio_process import FLUSH_TIMEOUT, ended, spawned, stop, watch

logger = logging.getLogger(__name__)

_READ_SIZE = 1 << 20


@asynccontextmanager
async def stdio_transport(
    params: StdioServerParameters,
    max_message_bytes: int = 2**31,
    label: str = "stdio",
    secrets: tuple[str, ...] = (),
    gone: Callable[[str], None] | None = None,
) -> AsyncIterator[TransportStreams]:
    """Spawn ``params``' server and talk to it over its stdin/stdout; leaving the context
    stops the whole process group (shielded, every wait bounded). ``label`` names the
    upstream session in the warnings about what it writes, and in its stderr's lines, which
    are logged without ``secrets`` (``upstreams/stderr.py``); ``gone`` is told how the
    process ended (its exit status) when its stdout ends before the gateway stops it."""
    if sys.platform == "win32":  # pragma: no cover
        async with stdio_client(params) as streams:
            yield streams
        return
    process = await spawned(params)
    stopping = anyio.Event()
    incoming_in, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_out = anyio.create_memory_object_stream[SessionMessage](0)
    written = anyio.Event()
    reading = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        told = _Told(stopping, gone)
        tg.start_soon(_read, process, incoming_in, max_message_bytes, label, reading, told)
        tg.start_soon(_write, process, outgoing_out, incoming_in, written)
        assert process.stderr is not None
        tg.start_soon(StderrLines(label, secrets).pass_on, process.stderr)
        tg.start_soon(watch, process, reading)
        try:
            yield incoming, outgoing
        finally:
            with anyio.CancelScope(shield=True):
                stopping.set()
                incoming.close()  # the reader drains from here on: a full pipe cannot block exit
                outgoing.close()
                with anyio.move_on_after(FLUSH_TIMEOUT):
                    await written.wait()
                await stop(process, label)
            tg.cancel_scope.cancel()


async def _read(
    process: Process,
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    limit: int,
    label: str,
    reading: anyio.CancelScope,
    told: _Told,
) -> None:
    assert process.stdout is not None
    lines, quiet = Lines(limit), QuietCount(allowance=START_ALLOWANCE)  # its banner first
    async with incoming:
        with (
            reading,
            lines,
            suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
        ):
            try:
                while True:
                    for line in lines.feed(await process.stdout.receive(_READ_SIZE)):
                        await _pass_on(line, incoming, limit, label, quiet)
                    lines.parsed()
            except UpstreamNoise as exc:  # the read ends here: its calls fail, saying why
                told.lost(str(exc))
                return
        await told(process)  # before the end of the stream: the session's reason is the process's


async def _pass_on(
    line: bytes | Oversized | Blank,
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    limit: int,
    label: str,
    quiet: QuietCount,
) -> None:
    """Parse ``line`` and pass it on, counted as noise unless it made a message; blank lines
    only counted, where they came. An oversized line's bytes are not counted, only its edges:
    one notification over ``max_message_bytes`` (or held back while the gateway held its bound
    of bytes) lost the session by its size.

    Raises:
        UpstreamNoise: past the bound (``QuietCount``).
    """
    if isinstance(line, Blank):
        quiet.heard(line.lines, line.size)
        return
    message = _parse(line, label) if isinstance(line, bytes) else refusal(line, limit, label)
    if isinstance(message, SessionMessage):
        quiet.message()
    elif isinstance(line, bytes):
        quiet.heard(1, len(line))
    else:  # a message too large to take (or held back): its edges parsed, not noise by its size
        quiet.heard(1, len(line.head) + len(line.tail))
    # Closed when shutting down: keep draining, so the server can flush and exit.
    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        await incoming.send(message)


@dataclass(frozen=True, slots=True)
class _Told:
    """Tells ``gone`` how the process ended once its stdout has, unless the gateway is
    stopping it (``stopping``): the session was lost for "connection closed", saying nothing
    of an exit status or a signal."""

    stopping: anyio.Event
    gone: Callable[[str], None] | None

    async def __call__(self, process: Process) -> None:
        if self.gone is not None and not self.stopping.is_set():
            self.lost(await ended(process))  # within FLUSH_TIMEOUT

    def lost(self, why: str) -> None:
        """The session is lost for ``why``: the process's end, or the gateway stopped reading it."""
        if self.gone is not None and not self.stopping.is_set():
            self.gone(why)


class Blank(NamedTuple):  # made for each blank line between messages: a tuple is cheapest
    """Blank lines one after another, dropped: noise, counted in their place among the
    messages (counted after a read's messages, a server ending each of 2,000 short messages a
    read with a blank line had them all taken for noise, with no message between)."""

    lines: int
    size: int


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line over the limit: its first and last bytes (where a response's id is) and its
    size; the rest was read and dropped, never held."""

    head: bytes
    tail: bytes
    size: int
    busy: bool = False
    """Dropped because the gateway held its bound of bytes in flight, not for its size."""

    @classmethod
    def held_back(cls, message: bytes) -> Oversized:
        """A whole ``message`` the gateway could not take (its bound of bytes in flight)."""
        return cls(message[:_EDGE], message[-_EDGE:], len(message), busy=True)


_EDGE = 512


class Lines:
    """Splits a byte stream into lines, in time linear in their size, holding at most
    ``limit`` bytes of any one line, and only while the process's bound of bytes in flight
    has room for them (``in_flight``): they are held from their read until ``parsed``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pieces: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None
        """Set once the current line passed the limit: its first bytes."""
        self._tail = b""
        self._busy = False
        self._held = 0
        """Bytes taken from ``IN_FLIGHT`` for the lines not yet parsed."""

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """The stream ended: what is held of an unfinished line is given back."""
        IN_FLIGHT.give(self._held)
        self._held = 0

    def parsed(self) -> None:
        """The lines fed so far are parsed: their bytes are no longer held here."""
        IN_FLIGHT.give(self._held - self._size if self._head is None else self._held)
        self._held = self._size if self._head is None else 0

    def feed(self, chunk: bytes) -> list[bytes | Oversized | Blank]:
        """The lines ``chunk`` ended, each run of blank ones as one ``Blank`` (noise: ``noise.py``)."""
        *complete, rest = chunk.split(b"\n")
        finished = [self._finish(part) for part in complete]
        self._add(rest)
        kept: list[bytes | Oversized | Blank] = []
        blank = size = 0
        for line in finished:
            if isinstance(line, bytes) and not line.strip():
                blank, size = blank + 1, size + len(line) + 1
                continue
            if blank:
                kept.append(Blank(blank, size))
                blank = size = 0
            kept.append(line)
        if blank:
            kept.append(Blank(blank, size))
        return kept

    def _add(self, part: bytes) -> None:
        self._size += len(part)
        if self._head is not None:
            self._tail = (self._tail + part[-_EDGE:])[-_EDGE:]
        elif self._size > self._limit or not IN_FLIGHT.take(len(part)):
            self._busy = self._size <= self._limit
            first = b"".join(p[:_EDGE] for p in self._pieces[:_EDGE]) + part[:_EDGE]
            self._head, self._tail = first[:_EDGE], part[-_EDGE:]
            self._pieces.clear()
        elif part:
            self._held += len(part)
            self._pieces.append(part)

    def _finish(self, part: bytes) -> bytes | Oversized:
        self._add(part)
        line: bytes | Oversized = (
            b"".join(self._pieces)
            if self._head is None
            else Oversized(self._head, self._tail, self._size, self._busy)
        )
        self._pieces.clear()
        self._size = 0
        self._head = None
        self._tail = b""
        self._busy = False
        return line


# A response's id at the top level: right after "jsonrpc" at the start (as Python SDKs write
# it), or as the last member (as the TypeScript SDK writes it). Anchored, so an "id" nested
# in the result is never taken for it.
_VALUE = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_ID_FIRST = re.compile(
    rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*' + _VALUE + rb'\s*,\s*"(?:result|error)"'
)
_ID_LAST = re.compile(rb'"id"\s*:\s*' + _VALUE + rb"\s*\}\s*$")
_RESPONSE_START = re.compile(rb'^\s*\{\s*"(?:result|error)"\s*:')


_REQUEST_ID_FIRST = re.compile(rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*' + _VALUE + rb"\s*,")


def request_id_of(head: bytes, tail: bytes) -> types.RequestId | None:
    """The id of a request known only by its first and last bytes (a line too long to read
    whole): right after "jsonrpc" at the start, or as the last member, as ``refusal`` reads a
    response's; None when it is in neither place."""
    found = _REQUEST_ID_FIRST.match(head) or _ID_LAST.search(tail)
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))
    except ValueError:
        return None
    return value if isinstance(value, int | str) else None


def refusal(
    line: Oversized, limit: int, label: str, log: logging.Logger = logger
) -> SessionMessage | Exception:
    """For an oversized response: an error answer to the request it answers, so that call
    fails at once saying why; for anything else, an error the session logs. The warning goes
    to ``log``: the transport's own logger."""
    reason = (
        str(IN_FLIGHT.busy(line.size))
        if line.busy
        else f"upstream message of {line.size} bytes is over max_message_bytes ({limit})"
    )
    return _unread(line.head, line.tail, reason, label, log)


def unread(
    message: bytes, reason: str, label: str, log: logging.Logger = logger
) -> SessionMessage | Exception:
    """For a whole ``message`` the gateway would not parse, as for an oversized one: an error
    answer to the request it answers, saying ``reason``; for anything else, an error the
    session logs. The warning goes to ``log``: the transport's own logger."""
    return _unread(message[:_EDGE], message[-_EDGE:], reason, label, log)


def _unread(
    head: bytes, tail: bytes, reason: str, label: str, log: logging.Logger
) -> SessionMessage | Exception:
    """``unread``, for a message known by its first and last bytes."""
    log.warning("upstream session %s: %s: dropped", label, reason, extra={"peer": label})
    found = _ID_FIRST.match(head)
    if found is None and _RESPONSE_START.match(head):
        found = _ID_LAST.search(tail)
    if found is None:
        return ValueError(reason)
    try:
        request_id = json.loads(found.group(1))
    except ValueError:
        return ValueError(reason)
    error = types.ErrorData(code=types.INTERNAL_ERROR, message=reason)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def _parse(line: bytes, label: str) -> SessionMessage | Exception:
    try:
        return SessionMessage(parse_message(line))
    except Unreadable as exc:
        return unread(line, str(exc), label)
    except ValueError as exc:  # handed to the session, which reports it and reads on
        if not is_utf8(line):  # answered at once, as another unreadable line
            return unread(line, NOT_UTF8, label)
        logger.warning(
            "upstream session %s wrote a line that is not JSON-RPC (%d bytes)",
            label,
            len(line),
            extra={"peer": label},
        )
        return exc


NOT_UTF8 = "the upstream's message is not valid UTF-8, as JSON-RPC's text must be"


def is_utf8(line: bytes) -> bool:
    """Whether ``line`` is UTF-8 (asked only of a message that failed to parse: the transports
    read bytes, undecoded, and leave the check to the parser)."""
    try:
        line.decode()
    except UnicodeDecodeError:
        return False
    return True


async def _write(
    process: Process,
    outgoing: MemoryObjectReceiveStream[SessionMessage],
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    written: anyio.Event,
) -> None:
    assert process.stdin is not None
    try:
        async with outgoing:
            async for message in outgoing:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send(data.encode() + b"\n")
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # Its stdin is gone, so it is as good as gone: end the read side too, so the
        # session sees the connection close instead of a request waiting for ever.
        await incoming.aclose()
    finally:
        written.set()
