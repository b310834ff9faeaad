"""HTTP/1.1 for the forwarder's POSTs: keep-alive connections of our own, parsed by httptools.

A forwarded ``tools/call`` posted on aiohttp costs about 0.3 ms of the gateway's CPU (its
request and response objects, multidicts, timers and payload writers); the same bytes on an
asyncio protocol with httptools' parser (uvicorn's, in C) cost about 0.07 (``bench/README.md``).
This carries only what the forwarder sends: a POST with a body of known length to an origin
reached directly (no proxy), over TCP or TLS, its answer read whole (JSON) or streamed (SSE,
``answer.py``). Everything else stays on aiohttp (``http_transport.py``), and errors are
httpx2's, as ``http_transport`` translates aiohttp's.

One request at a time per connection. A connection is used again only when its answer was
received to its end, the server keeps it alive, and nothing has come since; otherwise it is
closed: an answer left part-received would otherwise be read as the next one, and for a
modern-era upstream that close is the call's cancellation.
"""

from __future__ import annotations

import asyncio
import re
import select
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import cast

import anyio
import httptools
import httpx2
import yarl

from agent_gateway.upstreams.answer import Answer


class _Link(asyncio.Protocol):
    """One connection; the answer it is receiving, if any."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.lost = False
        self._interim = False
        self._parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, if not by class under uvloop (its own, with the same methods).
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        answer = self.answer
        if answer is None or answer.complete:
            return
        if answer.headed and answer.until_close:  # its body was all the server would send
            answer.ended(keep_alive=False)
        else:
            answer.fail(httpx2.RemoteProtocolError("server disconnected", request=answer.request))

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            answer.fail(httpx2.RemoteProtocolError(f"malformed answer: {exc}", request=answer.request))
            self.close()
            return
        # Counted per header too, but a header line is held by httptools until it ends.
        if not answer.headed and not answer.head(len(data)):
            self.close()

    # httptools' callbacks, in the order a message arrives.
    def on_message_begin(self) -> None:
        if self._answer().complete:  # a second answer to one request: the connection cannot be trusted
            raise httptools.HttpParserCallbackError("an answer nobody asked for")

    def on_status(self, status: bytes) -> None:
        self._answer().reason += status  # in pieces when the line spans two reads

    def on_header(self, name: bytes, value: bytes) -> None:
        answer = self._answer()
        if not answer.head(len(name) + len(value) + 4):
            raise httptools.HttpParserCallbackError("headers too large")
        answer.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._interim = True
            self._answer().interim()
        else:
            self._answer().received_headers(status)

    def on_body(self, body: bytes) -> None:
        self._answer().received(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._answer().ended(self._parser.should_keep_alive())

    def _answer(self) -> Answer:
        assert self.answer is not None  # data_received feeds the parser only while there is one
        return self.answer

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def reusable(self) -> bool:
        """Whether the idle connection may carry another request: open, and with nothing to
        read. Bytes waiting mean the server closed it (a keep-alive timeout) or broke protocol
        before the event loop has read them; looking once, as the request is about to be
        written, leaves only the race of a server closing it at that very moment."""
        if self.lost or self.transport is None or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return True
        poller = select.poll()  # not select(): it refuses descriptors past 1023
        try:
            poller.register(sock.fileno(), select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


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
        self._closed = False

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
        Leaving the context keeps the connection for the next request when the answer was
        received to its end, and closes it otherwise.

        Raises:
            httpx2.TransportError: the subclass httpx2 itself would raise.
        """
        head = _head(url.raw_path_qs, self._host_header, headers, len(content), request)
        await self._take_slot(limits.pool, request)
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
                answer.released()
            if link is not None:
                self._settle(link, answer)
            self._slots.release()

    async def _take_slot(self, pool: float | None, request: httpx2.Request) -> None:
        try:
            self._slots.acquire_nowait()  # no wait, and no turn of the loop, when one is free
        except anyio.WouldBlock:
            try:
                with anyio.fail_after(pool):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx2.PoolTimeout("no connection free in time", request=request) from None

    def _settle(self, link: _Link, answer: Answer | None) -> None:
        link.answer = None
        if (
            not self._closed
            and answer is not None
            and answer.complete
            and answer.keep_alive
            and not link.lost
        ):
            self._idle.append(link)
        else:
            link.close()

    async def _link(self, connect: float | None, request: httpx2.Request) -> _Link:
        while self._idle:
            link = self._idle.pop()
            if link.reusable():
                return link
            link.close()
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
        except ValueError as exc:  # a host name IDNA refuses, say
            raise httpx2.UnsupportedProtocol(
                f"cannot send to this URL: {type(exc).__name__}", request=request
            ) from exc
        if link.lost:  # closed by the server before anything was sent
            raise httpx2.ConnectError("the connection closed as it opened", request=request)
        return link

    def close(self) -> None:
        """Close the idle connections; the busy ones close when their exchange ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
"""A header name, as HTTP's grammar has it (RFC 9110 token)."""


def _head(target: str, host: str, headers: Mapping[str, str], length: int, request: httpx2.Request) -> bytes:
    """The request line and headers. A name that is not a token, or a value with a line break,
    would split the request (a tool name in ``Mcp-Name``, say): refused, as h11 refuses it."""
    lines = [f"POST {target} HTTP/1.1", f"host: {host}"]
    for name, value in headers.items():
        if not _TOKEN.match(name) or "\r" in value or "\n" in value or "\0" in value:
            raise httpx2.LocalProtocolError(f"the {name!r} header cannot be sent as it is", request=request)
        if name.lower() not in _SET_HERE:
            lines.append(f"{name}: {value}")
    lines.append(f"content-length: {length}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n"


_SET_HERE = frozenset({"host", "content-length", "transfer-encoding", "connection"})
