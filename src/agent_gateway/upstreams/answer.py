"""One answer on the forwarder's own connections (``wire.py``), as it arrives: its status and
headers, then its body, bounded when it is read whole, and the bound on bytes in flight."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import anyio
import httpx2

from agent_gateway.in_flight import IN_FLIGHT
from agent_gateway.shown_urls import redacted_url

logger = logging.getLogger(__name__)

HEADER_BYTES = 64 * 1024
"""The most an answer's status line and headers may hold, together."""
_PAUSE_AT = 256 * 1024
"""Bytes of an answer's body received and not yet read before the connection stops reading."""
_NO_BODY = frozenset({204, 304})


class CutShort(httpx2.StreamError):
    """An answer's body ended before its end (its length, or its last chunk): a
    ``StreamError`` too, so the SDK fails the one request whose body it was, not the session."""


class OversizedBody(httpx2.StreamError):
    """An answer's body grew past ``max_message_bytes``, or past what the process may hold in
    flight; the rest is not read.

    A ``StreamError``, which the SDK turns into an error answer for the one request whose
    body it was reading, leaving the connection to the upstream as it is.
    """


class OversizedEvent(httpx2.SSEError):
    """An SSE stream's unfinished event grew past what the process may hold in flight; the
    rest is not read. An ``SSEError``, as the reader's own for an event over its size: the SDK
    fails the request whose stream it was without reconnecting, and so does the forwarder."""


class BodyBound:
    """The bytes of one answer's body held: at most ``limit`` of it whole, counted against the
    process's bound of bytes in flight (``in_flight``) until given back. An SSE stream
    (``by_event``) is not bounded whole (its reader bounds each event under
    ``max_message_bytes``): only the bytes of the event not yet ended are held, since the
    reader keeps them until it does. Sixteen calls answered with one endless event each held
    1.8 GB before they were counted."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held = 0
        self._events = False
        self._tail = b""
        """The last bytes taken of a stream, for an event's end split between two reads."""

    def by_event(self) -> None:
        """The body is an SSE stream: from here, only its unfinished event is held."""
        self.limit, self._events = None, True

    def take(self, chunk: bytes) -> None:
        """Raises ``OversizedBody`` when ``chunk`` does not fit."""
        if self._events:
            self._take_event(chunk)
            return
        if self.limit is None:
            return
        if self._held + len(chunk) > self.limit:
            raise OversizedBody(f"the upstream's answer is over max_message_bytes ({self.limit} bytes)")
        self._hold(len(chunk))

    def give_back(self) -> None:
        IN_FLIGHT.give(self._held)
        self._held = 0

    def _take_event(self, chunk: bytes) -> None:
        # The chunk is searched in place (it may be large: not copied onto the tail); the last
        # bytes before it only when no event ends within it, for an end split between two reads.
        end = _last_end(chunk)
        if end is None and (at := _last_end(self._tail + chunk[:_TAIL])) is not None:
            end = at - len(self._tail)
        self._tail = (self._tail + chunk)[-_TAIL:] if len(chunk) < _TAIL else chunk[-_TAIL:]
        if end is None:
            self._hold(len(chunk))
            return
        unfinished = len(chunk) - end  # all of it read after the last event ended
        if unfinished < self._held:
            IN_FLIGHT.give(self._held - unfinished)
            self._held = unfinished
        else:
            self._hold(unfinished - self._held)

    def _hold(self, size: int) -> None:
        if not IN_FLIGHT.take(size):
            busy = str(IN_FLIGHT.busy(self._held + size))
            raise OversizedEvent(busy) if self._events else OversizedBody(busy)
        self._held += size


_EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")
"""What ends an SSE event: a blank line, after any of the three line ends."""
_TAIL = 3


def _last_end(data: bytes) -> int | None:
    """Where in ``data`` its last event ends (just past the blank line); None: none ends in it."""
    ends = [at + len(mark) for mark in _EVENT_ENDS if (at := data.rfind(mark)) >= 0]
    return max(ends) if ends else None


class CountedEvents(httpx2.AsyncByteStream):
    """An SSE stream's body as httpx2's own transport reads it (a legacy SSE upstream's, whose
    client is the SDK's), its unfinished event held against the bytes in flight as
    ``AiohttpTransport``'s are (``BodyBound.by_event``). Uncounted, one upstream's endless
    event held 5 times ``max_message_bytes`` (RSS 530 -> 754 MB at each reconnect), and
    several added up past the process's bound."""

    def __init__(self, stream: httpx2.AsyncByteStream) -> None:
        self._stream = stream
        self._bound = BodyBound(None)
        self._bound.by_event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._bound.take(chunk)
            yield chunk

    async def aclose(self) -> None:
        self._bound.give_back()
        await self._stream.aclose()


class Reading(Protocol):
    """The connection an answer arrives on, as far as the answer steers it."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Answer:
    """One answer as it arrives: status and headers, then its body. The connection feeds it
    (``head`` and ``received_headers``, ``received``, ``ended``, or ``fail``); the forwarder
    reads it (``arrived``, ``chunks``) and lets it go (``released``)."""

    def __init__(
        self, reading: Reading, request: httpx2.Request, limit: int | None, read_timeout: float | None
    ) -> None:
        self.request = request
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        """The body ends when the server closes (neither a length nor chunks)."""
        self.head_bytes = 0
        self._reading = reading
        self._paused = False
        self._bound = BodyBound(limit)
        self._read_timeout = read_timeout
        self._buffer = bytearray()
        self._error: httpx2.TransportError | None = None
        self._wake = anyio.Event()
        self.headed = False
        """The status and headers of the answer (not of a 1xx before it) are in."""
        self.content_type = ""
        """Its media type, lower case, without parameters (once headed)."""

    @property
    def streamed(self) -> bool:
        return self.content_type == "text/event-stream"

    @property
    def sets_cookie(self) -> bool:
        return self.header_value(b"set-cookie") is not None

    def header_value(self, wanted: bytes) -> str | None:
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == wanted), None)

    # -- fed by the connection -------------------------------------------------------------------

    def head(self, size: int) -> bool:
        """``size`` more bytes of the status line and headers; False once past ``HEADER_BYTES``
        (the answer has failed)."""
        self.head_bytes += size
        if self.head_bytes <= HEADER_BYTES:
            return True
        self.fail(httpx2.RemoteProtocolError("the answer's headers are too large", request=self.request))
        return False

    def interim(self) -> None:
        """A 1xx answer came first: what it said is not the answer's (as h11 and aiohttp skip it)."""
        self.headers, self.reason = [], b""

    def received_headers(self, status: int) -> None:
        self.status = status
        self.content_type = (self.header_value(b"content-type") or "").split(";", 1)[0].strip().lower()
        chunked = "chunked" in (self.header_value(b"transfer-encoding") or "").lower()
        length = self.header_value(b"content-length") is not None
        self.until_close = not chunked and not length and status not in _NO_BODY
        self.headed = True
        self._wake.set()

    def received(self, body: bytes) -> None:
        self._buffer += body
        if len(self._buffer) > _PAUSE_AT and not self._paused:
            self._paused = True
            self._reading.pause_reading()  # resumed as the reader takes what is here
        self._wake.set()

    def ended(self, keep_alive: bool) -> None:
        self.complete, self.keep_alive = True, keep_alive
        self._wake.set()

    def fail(self, error: httpx2.TransportError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._wake.set()

    def released(self) -> None:
        """The exchange is over: what was held goes back, and a connection kept for the next
        request reads again (a reader that stopped early may have left it paused)."""
        self._bound.give_back()
        self._buffer.clear()
        self._resume()

    # -- read by the forwarder -------------------------------------------------------------------

    async def arrived(self) -> None:
        """Wait for the status and headers. An SSE stream's body is then not bounded whole:
        its reader bounds each event."""
        while not self.headed:
            await self._wait()
        if self._error is not None:
            raise self._error
        if self.streamed:
            self._bound.by_event()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, all that is here at each turn (not chunk by chunk: a server
        sending one byte at a time costs no more), counted against the bound when there is one."""
        while True:
            if self._buffer:
                chunk = bytes(self._buffer)
                self._buffer.clear()
                self._resume()
                self._bound.take(chunk)
                yield chunk
                continue
            if self.complete:
                return
            await self._wait()

    async def read(self) -> bytes:
        """The whole body (raises ``OversizedBody``, or the read's ``httpx2.TransportError``)."""
        return b"".join([chunk async for chunk in self.chunks()])

    def as_httpx2(self) -> httpx2.Response:
        """The answer as httpx2's response, its body streaming from the connection, never
        decoded (``uncoded``)."""
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers]
        return httpx2.Response(
            self.status,
            headers=uncoded(headers, self.request),
            stream=_Body(self),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": self.reason},
            request=self.request,
        )

    async def _wait(self) -> None:
        """Until the connection feeds something, or ``read_timeout`` passes without it. A loop
        timer, not a cancel scope: about a fiftieth of a forwarded call's CPU went to the scope."""
        if self._error is not None:
            raise self._error
        self._wake = anyio.Event()
        timer = None
        if self._read_timeout is not None:
            timer = asyncio.get_running_loop().call_later(self._read_timeout, self._timed_out)
        try:
            await self._wake.wait()
        finally:
            if timer is not None:
                timer.cancel()
        if self._error is not None and not self._buffer:
            raise self._error

    def _resume(self) -> None:
        """The connection reads again, if ``received`` paused it."""
        if self._paused:
            self._paused = False
            self._reading.resume_reading()

    def _timed_out(self) -> None:
        self.fail(httpx2.ReadTimeout("timed out", request=self.request))


def uncoded(headers: list[tuple[str, str]], request: httpx2.Request) -> list[tuple[str, str]]:
    """An answer's ``headers`` without its ``Content-Encoding``, which was not asked for (every
    request asks for ``identity``): httpx2 would inflate the body as it is read, and its bounds
    (``max_message_bytes``, the bytes in flight) count the bytes received. A 2 MB gzip body of
    a 500 answer to a forwarded call, read whole for its JSON-RPC error, took the gateway to
    4.3 GB. The body then reaches its reader as the bytes it is (which fail to parse)."""
    # Every header read, as httpx2 reads them (the first alone let "identity" then "gzip" by).
    coding = ", ".join(v.strip().lower() for k, v in headers if k.lower() == "content-encoding")
    if coding in ("", "identity"):
        return headers
    where = redacted_url(str(request.url))  # its query may hold a key
    logger.warning("upstream answered %s coded %r, unasked: not decoded", where, coding[:64])
    return [(k, v) for k, v in headers if k.lower() != "content-encoding"]


class _Body(httpx2.AsyncByteStream):
    """An answer's body for httpx2's response; the connection is ``Origin.post``'s to keep or close."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._answer.chunks():
            yield chunk
