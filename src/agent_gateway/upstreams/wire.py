"""HTTP/1.1 for the forwarder's POSTs: keep-alive connections of our own, parsed by httptools.

A forwarded ``tools/call`` posted on aiohttp costs about 0.3 ms of the gateway's CPU (its
request and response objects, multidicts, timers and payload writers); the same bytes on an
asyncio protocol with httptools' parser (uvicorn's, in C) cost about 0.07 (``bench/README.md``).
This carries only what the forwarder sends: a POST with a body of known length to an origin
reached directly (no proxy), over TCP or TLS, its answer read whole (JSON) or streamed (SSE).
Everything else stays on aiohttp (``http_transport.py``), and errors are httpx2's, as
``http_transport`` translates aiohttp's.

One request at a time per connection; a connection is used again only when its answer was
read to its end and the server keeps it alive. An answer left part-read (a cancelled call, a
body over its bound) closes its connection: its remaining bytes would otherwise be read as
the next answer, and for a modern-era upstream that close is the call's cancellation.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import cast

import anyio
import httptools
import httpx2
import yarl

from agent_gateway.in_flight import IN_FLIGHT

HEADER_BYTES = 64 * 1024
"""The most an answer's status line and headers may hold (as ``http_transport``'s limit)."""
_PAUSE_AT = 256 * 1024
"""Bytes of an answer's body received and not yet read before the connection stops reading."""


class OversizedBody(httpx2.StreamError):
    """An answer's body grew past ``max_message_bytes``, or past what the process may hold in
    flight; the rest is not read.

    A ``StreamError``, which the SDK turns into an error answer for the one request whose
    body it was reading, leaving the connection to the upstream as it is.
    """


class BodyBound:
    """The bytes of one answer's body read so far: at most ``limit`` (None: not bounded whole,
    as an SSE stream, whose reader bounds each event), and, when bounded, counted against the
    process's bound of bytes in flight (``in_flight``) until given back."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held = 0

    def take(self, size: int) -> None:
        """Raises ``OversizedBody`` when ``size`` more bytes do not fit."""
        if self.limit is None:
            return
        if self._held + size > self.limit:
            raise OversizedBody(f"the upstream's answer is over max_message_bytes ({self.limit} bytes)")
        if not IN_FLIGHT.take(size):
            raise OversizedBody(str(IN_FLIGHT.busy(self._held + size)))
        self._held += size

    def give_back(self) -> None:
        IN_FLIGHT.give(self._held)
        self._held = 0


class _Link(asyncio.Protocol):
    """One connection; the answer it is receiving, if any."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.lost = False
        self._parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, if not by class under uvloop (its own, with the same methods).
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.complete:
            self.answer.fail(httpx2.RemoteProtocolError("server disconnected", request=self.answer.request))

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.answer.fail(
                httpx2.RemoteProtocolError(f"malformed answer: {exc}", request=self.answer.request)
            )
            self.close()

    # httptools' callbacks, in the order a message arrives.
    def on_message_begin(self) -> None:
        assert self.answer is not None
        if self.answer.complete:  # a second answer to one request: the connection cannot be trusted
            raise httptools.HttpParserCallbackError("an answer nobody asked for")

    def on_status(self, status: bytes) -> None:
        assert self.answer is not None
        self.answer.reason = status

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.answer is not None
        self.answer.header(name, value)

    def on_headers_complete(self) -> None:
        assert self.answer is not None
        self.answer.headed(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.answer is not None
        self.answer.received(body)

    def on_message_complete(self) -> None:
        assert self.answer is not None
        self.answer.ended(self._parser.should_keep_alive())

    def reusable(self) -> bool:
        """Whether the connection may carry another request: open, and with nothing to read.
        An idle connection with bytes waiting was closed by the server (a keep-alive timeout)
        or broke protocol; looking once, before the request is written, leaves only the race
        of a server closing it at that very moment."""
        if self.lost or self.transport is None or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return True
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Answer:
    """One answer as it arrives: status and headers, then its body (bounded when whole)."""

    def __init__(
        self, link: _Link, request: httpx2.Request, limit: int | None, read_timeout: float | None
    ) -> None:
        self.request = request
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self._link = link
        self._bound = BodyBound(limit)
        self._read_timeout = read_timeout
        self._header_bytes = 0
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._error: httpx2.TransportError | None = None
        self._wake = anyio.Event()
        self._headed = False

    @property
    def streamed(self) -> bool:
        return self.content_type == "text/event-stream"

    @property
    def content_type(self) -> str:
        value = self.header_value(b"content-type") or ""
        return value.split(";", 1)[0].strip().lower()

    @property
    def sets_cookie(self) -> bool:
        return any(name.lower() == b"set-cookie" for name, _ in self.headers)

    def header_value(self, wanted: bytes) -> str | None:
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == wanted), None)

    # -- fed by the connection -------------------------------------------------------------------

    def header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > HEADER_BYTES:
            self.fail(httpx2.RemoteProtocolError("the answer's headers are too large", request=self.request))
            self._link.close()
            return
        self.headers.append((name, value))

    def headed(self, status: int) -> None:
        self.status, self._headed = status, True
        self._wake.set()

    def received(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_AT and self._link.transport is not None:
            self._link.transport.pause_reading()  # resumed as the reader takes what is here
        self._wake.set()

    def ended(self, keep_alive: bool) -> None:
        self.complete, self.keep_alive = True, keep_alive
        self._wake.set()

    def fail(self, error: httpx2.TransportError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._wake.set()

    # -- read by the forwarder -------------------------------------------------------------------

    async def arrived(self) -> None:
        """Wait for the status and headers. An SSE stream's body is then not bounded whole:
        its reader bounds each event."""
        while not self._headed:
            await self._wait()
        if self.streamed:
            self._bound.limit = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, each chunk counted against the bound when there is one."""
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered <= _PAUSE_AT and self._link.transport is not None:
                    self._link.transport.resume_reading()
                self._bound.take(len(chunk))
                yield chunk
            if self.complete:
                return
            await self._wait()

    async def read(self) -> bytes:
        """The whole body (raises ``OversizedBody``, or the read's ``httpx2.TransportError``)."""
        return b"".join([chunk async for chunk in self.chunks()])

    def as_httpx2(self) -> httpx2.Response:
        """The answer as httpx2's response, its body streaming from the connection."""
        return httpx2.Response(
            self.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers],
            stream=_Body(self),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": self.reason},
            request=self.request,
        )

    def give_back(self) -> None:
        self._bound.give_back()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._wake = anyio.Event()
        try:
            with anyio.fail_after(self._read_timeout):
                await self._wake.wait()
        except TimeoutError:
            raise httpx2.ReadTimeout("timed out", request=self.request) from None
        if self._error is not None and not self._chunks:
            raise self._error


class _Body(httpx2.AsyncByteStream):
    """An answer's body for httpx2's response; the connection is ``Origin.post``'s to keep or close."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._answer.chunks():
            yield chunk


class Origin:
    """Keep-alive connections to one ``scheme://host:port``, at most ``max_connections`` busy."""

    def __init__(
        self, url: yarl.URL, *, ssl_context: ssl.SSLContext | None, max_connections: int, max_body: int | None
    ) -> None:
        self._host = url.raw_host or ""
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = (ssl_context or ssl.create_default_context()) if url.scheme == "https" else None
        self._host_header = url.host_port_subcomponent or self._host
        self._max_body = max_body
        self._slots = anyio.Semaphore(max_connections)
        self._idle: list[_Link] = []

    @asynccontextmanager
    async def post(
        self,
        url: yarl.URL,
        request: httpx2.Request,
        content: bytes,
        headers: Mapping[str, str],
        limits: httpx2.Timeout,
    ) -> AsyncIterator[Answer]:
        """POST ``content`` to ``url`` (on this origin); the answer once its headers are in.
        Leaving the context gives the connection back when the answer was read to its end.

        Raises:
            httpx2.TransportError: the subclass httpx2 itself would raise.
        """
        head = _head(url.raw_path_qs, self._host_header, headers, len(content), request)
        try:
            self._slots.acquire_nowait()  # no wait, and no turn of the loop, when one is free
        except anyio.WouldBlock:
            try:
                with anyio.fail_after(limits.pool):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx2.PoolTimeout("no connection free in time", request=request) from None
        link: _Link | None = None
        answer: Answer | None = None
        try:
            link = await self._link(limits.connect, request)
            answer = link.answer = Answer(link, request, self._max_body, limits.read)
            assert link.transport is not None
            link.transport.write(head + content)
            await answer.arrived()
            yield answer
        finally:
            if answer is not None:
                answer.give_back()
            if link is not None:
                link.answer = None
                if answer is not None and answer.complete and answer.keep_alive and link.reusable():
                    self._idle.append(link)
                else:
                    link.close()
            self._slots.release()

    async def _link(self, connect: float | None, request: httpx2.Request) -> _Link:
        while self._idle:
            link = self._idle.pop()
            if link.reusable():
                return link
        loop = asyncio.get_running_loop()
        try:
            with anyio.fail_after(connect):
                _, link = await loop.create_connection(
                    _Link,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
        except TimeoutError:
            raise httpx2.ConnectTimeout("connect timed out", request=request) from None
        except OSError as exc:
            raise httpx2.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return link

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _head(target: str, host: str, headers: Mapping[str, str], length: int, request: httpx2.Request) -> bytes:
    """The request line and headers. A name or value with a line break would split the
    request (a tool name in ``Mcp-Name``, say): refused, as aiohttp and h11 refuse it."""
    lines = [f"POST {target} HTTP/1.1", f"host: {host}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise httpx2.LocalProtocolError(f"the {name!r} header holds a line break", request=request)
        if name.lower() not in _SET_HERE:
            lines.append(f"{name}: {value}")
    lines.append(f"content-length: {length}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n"


_SET_HERE = frozenset({"host", "content-length", "transfer-encoding", "connection"})
