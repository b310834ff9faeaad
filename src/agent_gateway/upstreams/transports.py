"""Building the client transport for one upstream, and watching it: for end-of-stream, and
for responses to nothing it sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx2
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage

from agent_gateway.compat.mcp import (
    MCP_DEFAULT_SSE_READ_TIMEOUT,
    MCP_DEFAULT_TIMEOUT,
    ReadStream,
    TransportStreams,
    create_mcp_http_client,
    lean_client_parsing,
    lean_result_checks,
)
from agent_gateway.compat.resumed import HttpSession, http_session
from agent_gateway.compat.sse import sse_client
from agent_gateway.compat.streams import StreamWrapper
from agent_gateway.config import UpstreamConfig
from agent_gateway.trace_context import trace_headers
from agent_gateway.upstreams.answer import CountedEvents
from agent_gateway.upstreams.correlation import RecordingWriteStream, SentRequests
from agent_gateway.upstreams.environment import check_command, child_environment
from agent_gateway.upstreams.http_client import UpstreamClient, bounded_jar, ssl_context
from agent_gateway.upstreams.pace import Pace
from agent_gateway.upstreams.stdio import stdio_transport, unread
from agent_gateway.upstreams.translation import secrets_of
from agent_gateway.upstreams.websocket import websocket_client


class WritesEnded:
    """Told by a transport whose writes stopped while its stream reads on (or, by a WebSocket
    transport, why its connection ended: the calls it fails say the close's code and reason,
    where the SDK says "Connection closed"; by a stdio transport, how its process ended). The SDK's legacy SSE
    client stops POSTing at its first failed POST (a 500, a reset) and says nothing else: the
    call whose POST failed waited its whole timeout, every later one failed at once as
    "Connection closed", and the upstream was reported up (its health checks "answered") for
    as long as its stream stayed open. Here the session is lost, saying why (reconnected with
    the usual backoff), and the read in progress ends: the SDK fails the calls pending on the
    connection at once, as when its stream drops."""

    def __init__(self, lose: Callable[[str], None]) -> None:
        self._lose = lose
        self.ended = False
        self.watched = False
        """Whether the transport can end its writes alone (legacy SSE): only then is each read
        made in a scope of its own (a few microseconds a message, on every call's path)."""
        self.reading: anyio.CancelScope | None = None
        """The scope of the read in progress (``WatchedReadStream``), cancelled at the end."""

    def __call__(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        self._lose(reason)
        if self.reading is not None:
            self.reading.cancel()


class WatchedReadStream(StreamWrapper[ReadStream[SessionMessage | Exception]]):
    """A read stream that calls ``closed`` when the peer's stream ends (or its writes do:
    ``WritesEnded``), drops responses to ids the session never sent (``correlation``), and
    takes what the peer sends unasked at its ``pace``.

    Wraps rather than relays, so there is no extra hop per message and the sender's
    context snapshot (``last_context``) stays visible to the dispatcher.
    """

    def __init__(
        self,
        inner: ReadStream[SessionMessage | Exception],
        closed: Callable[[], None],
        sent: SentRequests,
        pace: Pace,
        answer: RecordingWriteStream,
        writes: WritesEnded,
    ) -> None:
        """``answer``: where the upstream's requests past ``pace``'s bound are refused."""
        self._inner = inner
        self._closed = closed
        self._sent = sent
        self._pace = pace
        self._answer = answer
        self._writes = writes

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            while True:
                item = await self._next()
                if self._pace.counts(item):
                    assert isinstance(item, SessionMessage)  # counts() says so
                    # The reader waits for its turn: the upstream's writes wait in turn.
                    refusal = await self._pace.take(item)
                    if refusal is not None:
                        await self._answer.send(SessionMessage(refusal))
                    elif self._pace.heeded(item):
                        return item
                    continue
                if isinstance(item, Exception) or self._sent.admits(item):
                    return item
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._closed()
            raise

    async def _next(self) -> SessionMessage | Exception:
        """The inner stream's next item; its end once the transport's writes ended."""
        if not self._writes.watched:
            return await self._inner.receive()
        with anyio.CancelScope() as self._writes.reading:
            if not self._writes.ended:
                return await self._inner.receive()
        raise anyio.EndOfStream

    def __aiter__(self) -> WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None


@asynccontextmanager
async def watched(
    transport: Transport, closed: Callable[[], None], label: str, pace: Pace, writes: WritesEnded
) -> AsyncIterator[TransportStreams]:
    """Enter ``transport`` for upstream session ``label``; ``closed`` is called when its read
    side reaches end-of-stream, or its writes end (``writes``, told by the transport, or a
    send finding its write side closed); responses only pass to requests sent on it; what it
    sends unasked is read at ``pace``."""
    sent = SentRequests(label)
    async with transport as (read_stream, write_stream):
        writing = RecordingWriteStream(write_stream, sent, pace, writes)
        yield WatchedReadStream(read_stream, closed, sent, pace, writing, writes), writing


_UNCODED = {"Accept-Encoding": "identity"}
"""Asked of every HTTP upstream: httpx2 inflates a coded answer without bound (``http_transport``)."""

PROBE_LANE = 32
"""Connections kept free of calls: health checks, list refreshes, the listening stream."""


def pool_size(config: UpstreamConfig) -> int:
    """Connections to one HTTP upstream: its calls in flight, plus the probe lane."""
    return (config.max_concurrency or 224) + PROBE_LANE


def _http_client(config: UpstreamConfig) -> UpstreamClient:
    # Imported here: aiohttp (~0.16 s of a start) only where an upstream is reached over HTTP.
    from agent_gateway.upstreams.http_transport import AiohttpTransport

    assert config.url is not None
    secure = config.url.startswith("https:")
    return UpstreamClient(
        headers=dict(config.headers) | _UNCODED,
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        # The upstream connection is shared by every client of the gateway: a connection for
        # each call in flight (max_concurrency) plus a lane that calls never fill, so a health
        # check or a list refresh never waits behind them (and never marks a busy upstream down).
        wire=AiohttpTransport(
            max_connections=pool_size(config),
            ssl_context=ssl_context() if secure else None,
            max_body_bytes=config.max_message_bytes,
        ),
        event_hooks={"request": [trace_headers]},
    )


def _traced(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """The SSE transport's HTTP client: the SDK's, plus the trace-context hook; asking for
    no content coding (httpx2 would inflate a coded answer without bound); its cookies
    bounded (``BoundedCookies``: an upstream setting 50 new ones an answer made a 1 MB
    ``Cookie`` header within 20 POSTs)."""
    client = create_mcp_http_client((headers or {}) | _UNCODED, timeout, auth)
    client.cookies = bounded_jar()  # as a Streamable HTTP upstream's (``UpstreamClient``)
    client.event_hooks["request"].append(trace_headers)
    client.event_hooks["response"].extend([_uncoded, _counted])
    return client


async def _uncoded(response: httpx2.Response) -> None:
    """An answer coded though none was asked for is read as the bytes it is: httpx2 picks its
    decoder from this header when the body is first read, after the hooks."""
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        del response.headers["content-encoding"]


async def _counted(response: httpx2.Response) -> None:
    """An SSE stream's unfinished event is counted in flight (``CountedEvents``), its body
    not yet read when the hooks run."""
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind == "text/event-stream" and isinstance(response.stream, httpx2.AsyncByteStream):
        response.stream = CountedEvents(response.stream)


@asynccontextmanager
async def open_transport(
    config: UpstreamConfig, link: HttpSession, label: str, writes: WritesEnded
) -> AsyncIterator[TransportStreams]:
    """Open the transport ``config`` names; leaving the context closes it (and reaps a child).
    ``link``: the Streamable HTTP session to resume or keep (other transports ignore it);
    ``label``: the upstream session, as the transport's warnings name it; ``writes``: told
    when a legacy SSE transport stops sending (a failed POST ends its writer alone), why a
    WebSocket's connection ended, or how a stdio upstream's process did."""
    lean_result_checks()  # every transport's client session checks results alike
    async with AsyncExitStack() as stack:
        kind = config.kind
        if kind == "stdio":
            assert config.command is not None  # guaranteed by UpstreamConfig validation
            environment = child_environment(config)
            check_command(config.command, environment, config.cwd)
            params = StdioServerParameters(
                command=config.command, args=list(config.args), env=environment, cwd=config.cwd
            )
            transport: Transport = stdio_transport(
                params, config.max_message_bytes, label, secrets_of(config), gone=writes
            )
        else:
            assert config.url is not None
            if kind == "sse":
                refuse = partial(unread, label=label)
                writes.watched = True
                limit = config.max_message_bytes
                transport = sse_client(
                    config.url, dict(config.headers), _traced, limit, refuse, writes, label, config.timeout
                )
            elif kind == "websocket":
                limit = config.max_message_bytes
                transport = websocket_client(config.url, config.headers, limit, label, ended=writes)
            else:
                lean_client_parsing()  # half the memory for a large answer
                http = await stack.enter_async_context(_http_client(config))
                # One SSE event holds one message: the SDK's own bound (1 MiB) would refuse
                # a larger result and count it as the connection lost.
                transport = http_session(config.url, http, config.max_message_bytes, link, label)
        yield await stack.enter_async_context(transport)
