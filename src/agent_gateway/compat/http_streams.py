"""The SDK's Streamable HTTP client transport, with what an upstream's streams may cost
bounded (verified against mcp 2.3.0 and httpx2's ``EventSource``, whose parser and its two
decoders' counts the noise bound reads; ``tests/test_compat.py`` checks each member used).

- **A request given up is let go.** In the handshake era the SDK sends a cancelled request's
  ``notifications/cancelled`` and goes on reading its answer's stream until the upstream ends
  it: a call that timed out against an upstream that drips kept its POST, its connection and
  its bytes in flight (up to the pool's size per upstream). The frame is that era's
  cancellation (a disconnect is not one), so once it is sent the POST is aborted, as the SDK
  does at once in the modern era.
- **Streams are reopened at most once a second.** The SDK waits as long as the upstream's
  ``retry`` says before reopening a stream that ended, zero included, and starts counting
  afresh for every stream that opened: an upstream answering each call with ``retry: 0`` and
  ending every stream at once had 16 calls make 46,000 GETs in 45 s.
- **A request's stream is resumed at most ``MAX_RESUMPTIONS`` times.** The SDK resumes by
  recursion, a frame deeper each time; past the bound the request fails, saying why.
- **An answer that ended before it came is marked so** (``cut_short``). The SDK fails such a
  request with the code of a closed connection, -32000, which is also JSON-RPC's first server
  error, the one upstreams answer their own errors with: read as a closed connection, an
  upstream's ``-32000 bad input`` failed the call as cut short, and over stdio ended the
  session for every client.
- **A stream that sends only what makes no message is ended** (``QUIET_BYTES``): comments,
  blank lines, events without data or whose data makes no message. Nothing else bounds them (the notification pace counts
  messages): an upstream sending ``:`` lines without end on its GET stream took 88 % of a
  core with no call in flight, a bystander's p50 6 ms -> 298 ms. The stream ends as if the
  upstream ended it, and is reopened at the pace above; a keep-alive every few seconds is far
  below the bound. A modern call's own answer stream, read by the forwarder through the same
  count (``quiet_events``), fails its call instead: it was parsed until the call's timeout.
  So does a handshake-era call's answer stream (the POST's, read by the SDK's transport
  through ``EventSource``, replaced in its module by ``_AnswerEvents``): comments without end
  were parsed until the call's timeout, 31 % of a core all along.
- **A notification it cannot read on a request's stream is dropped**, as over stdio, not
  made the request's failure: the SDK fails the request on any message of its stream it
  cannot parse, since that one may have been the answer. A message whose first member (after
  ``jsonrpc``) is its ``method`` is no answer; any other still fails the request.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, cast

import anyio
import httpx2
from httpx2._exceptions import request_context
from httpx2._sse import _SSEParser  # pyright: ignore[reportPrivateUsage]
from mcp.client import streamable_http
from mcp.client.streamable_http import RequestContext, StreamableHTTPTransport, StreamWriter
from mcp.shared._httpx_utils import sse_within_origin
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    RequestId,
)

from agent_gateway.compat.streams import StreamWrapper
from agent_gateway.noise import QUIET_BYTES, QUIET_WINDOW, QuietCount, UpstreamNoise

logger = logging.getLogger(__name__)

RETRY_FLOOR_MS = 1000
"""The least wait before a stream is reopened: the SDK's own when the upstream names none."""
MAX_RESUMPTIONS = 256
"""Times one request's answer stream is reopened before the request fails."""
NOISE = f"the answer's stream sent over {QUIET_BYTES} bytes within {QUIET_WINDOW:g} s that made no message"
"""Why a call whose answer's stream sent noise past the bound failed."""

_CUT_SHORT = "agent_gateway.cut_short"


def cut_short(message: str) -> ErrorData:
    """The error of a request whose answer ended before it came, marked as the transport's
    own: not an upstream's answer with the same code (see above)."""
    return ErrorData(code=CONNECTION_CLOSED, message=message, data={_CUT_SHORT: True})


_NOTIFICATION_HEAD = re.compile(r'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"method"\s*:')


def names_its_method_first(data: str) -> bool:
    """Whether the JSON-RPC message ``data`` is told by its first members to be no answer
    (its ``method`` comes before any ``id``, ``result`` or ``error``), read or not."""
    return _NOTIFICATION_HEAD.match(data) is not None


def is_cut_short(error: ErrorData) -> bool:
    """Whether ``error`` is a transport's ``cut_short`` (an upstream sending the mark on an
    error of its own has only its own call read as cut short)."""
    return isinstance(error.data, dict) and error.data.get(_CUT_SHORT) is True  # pyright: ignore[reportUnknownMemberType]


@dataclasses.dataclass
class _Session:
    label: str
    """The upstream session, as the warning of a stream ended for its noise names it."""
    warned: bool = False


_FLOORED: weakref.WeakKeyDictionary[httpx2.AsyncClient, _Session] = weakref.WeakKeyDictionary()
"""The upstream sessions' HTTP clients: their streams' ``retry`` is floored and their noise
bounded (other users of the SDK in the process, tests' clients among them, are left as they are)."""


_MESSAGE_MADE: ContextVar[bool] = ContextVar("sse_message_made", default=False)
"""Whether the event a stream's reader last yielded made a message (set as the SDK's transport
handles it, in the reader's task): an upstream alternating events whose data is no message with
comments reset the noise count at each."""


_ANSWERING: ContextVar[bool] = ContextVar("sse_answering", default=False)
"""Whether the SDK's transport is reading a POST's answer for an upstream session (other users
of the SDK in the process are left as they are)."""


class _AnswerEvents(httpx2.EventSource):
    """``EventSource``, for a POST's answer to an upstream session read through ``quiet_events``:
    past its bound the SDK fails the call, an ``SSEError`` saying why (``NOISE``)."""

    def __init__(self, response: httpx2.Response, max_event_size: int | None = None) -> None:
        super().__init__(response, max_event_size=max_event_size)
        self._event_bytes = max_event_size
        self._bounded = _ANSWERING.get()

    async def __aiter__(self) -> AsyncIterator[httpx2.ServerSentEvent]:
        if not self._bounded:
            async for event in super().__aiter__():
                yield event
            return
        try:
            async for event in quiet_events(self.response, self._event_bytes):
                yield event
        except StreamNoise:
            raise httpx2.SSEError(NOISE) from None


class _Watched(StreamWrapper[StreamWriter]):
    """The SDK's read stream writer, noting whether a message (not an error) went on it."""

    def __init__(self, inner: StreamWriter) -> None:
        self._inner = inner
        self.made = False

    async def send(self, item: SessionMessage | Exception, /) -> None:
        self.made = self.made or isinstance(item, SessionMessage)
        await self._inner.send(item)


class BoundedTransport(StreamableHTTPTransport):
    """``StreamableHTTPTransport`` with its streams' cost bounded (see above)."""

    def __init__(self, url: str, *, max_sse_event_size: int | None) -> None:
        super().__init__(url, max_sse_event_size=max_sse_event_size)
        self._resumed: dict[int, int] = {}
        """Reopenings so far of each request being resumed, by its context's identity."""

    @staticmethod
    def floored(client: httpx2.AsyncClient, label: str) -> None:
        """The streams ``client`` opens for this transport (upstream session ``label``) wait at
        least ``RETRY_FLOOR_MS``, and end past ``QUIET_BYTES`` of noise."""
        _FLOORED[client] = _Session(label)
        streamable_http.sse_within_origin = _floored  # pyright: ignore[reportPrivateImportUsage]
        streamable_http.EventSource = _AnswerEvents  # pyright: ignore[reportPrivateImportUsage]

    async def _handle_sse_response(self, response: httpx2.Response, ctx: RequestContext) -> None:
        """As the SDK's, its noise bounded: past ``QUIET_BYTES`` the call fails (``NOISE``)."""
        token = _ANSWERING.set(True)  # read as the SDK makes its ``EventSource``, in this task
        try:
            await super()._handle_sse_response(response, ctx)
        finally:
            _ANSWERING.reset(token)

    async def _handle_post_request(self, ctx: RequestContext) -> None:
        try:
            await super()._handle_post_request(ctx)
        finally:
            self._let_go(ctx.session_message.message)

    def _let_go(self, message: JSONRPCMessage) -> None:
        """After a cancel frame (sent or failed), abort the POST of the request it names."""
        if not (isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled"):
            return
        request_id = cancelled_request_id_from_params(message.params)
        post = self._in_flight_posts.get(request_id) if request_id is not None else None
        if post is not None:
            logger.debug("aborting the POST of cancelled request %r", request_id)
            post.scope.cancel()

    async def _handle_sse_event(
        self,
        sse: httpx2.ServerSentEvent,
        read_stream_writer: StreamWriter,
        original_request_id: RequestId | None = None,
        resumption_callback: Callable[[str], Awaitable[None]] | None = None,
    ) -> bool:
        """As the SDK's, but a message that names its method first is handled as one on the
        session's own stream, where one it cannot read is reported to the session, which
        reads on (the request's id is used only to fail the request, or for its answer)."""
        if original_request_id is not None and sse.event == "message" and names_its_method_first(sse.data):
            original_request_id = None
        watched = _Watched(read_stream_writer)
        done = await super()._handle_sse_event(
            sse,
            cast(StreamWriter, watched),  # only its send is used
            original_request_id,
            resumption_callback,
        )
        if watched.made:
            message_made()  # read by the stream's reader, in this task (``quiet_events``)
        return done

    async def _resolve_abandoned_request(
        self,
        read_stream_writer: StreamWriter,
        request_id: RequestId,
        message: str,
        *,
        code: int = CONNECTION_CLOSED,
    ) -> None:
        """As the SDK's, with its error marked ``cut_short`` when it is one."""
        error = cut_short(message) if code == CONNECTION_CLOSED else ErrorData(code=code, message=message)
        try:
            await read_stream_writer.send(
                SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
            )
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("read stream closed before request %r could be resolved", request_id)

    async def _handle_reconnection(
        self,
        ctx: RequestContext,
        last_event_id: str,
        retry_interval_ms: int | None = None,
        attempt: int = 0,
    ) -> None:
        key = id(ctx)  # the same context at every depth of one request's resumption
        done = self._resumed.get(key, 0)
        if done >= MAX_RESUMPTIONS:
            assert isinstance(ctx.session_message.message, JSONRPCRequest)
            message = f"the upstream ended this answer's stream {MAX_RESUMPTIONS} times without the answer"
            await self._resolve_abandoned_request(
                ctx.read_stream_writer, ctx.session_message.message.id, message
            )
            return
        self._resumed[key] = done + 1
        try:
            retry = max(retry_interval_ms or 0, RETRY_FLOOR_MS)
            await super()._handle_reconnection(ctx, last_event_id, retry, attempt)
        finally:
            if done == 0:
                del self._resumed[key]


@asynccontextmanager
async def _floored(
    client: httpx2.AsyncClient,
    url: httpx2.URL | str,
    *,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> AsyncIterator[httpx2.EventSource]:
    """``sse_within_origin``, for an upstream session's client its events' ``retry`` at least
    ``RETRY_FLOOR_MS`` and its noise bounded (``QUIET_BYTES``)."""
    async with sse_within_origin(client, url, headers=headers, **options) as events:
        session = _FLOORED.get(client)
        yield events if session is None else _FlooredEvents(events, session, options.get("max_event_size"))


class _FlooredEvents(httpx2.EventSource):
    """``EventSource``'s reading (its parser's), ended once ``QUIET_BYTES`` arrive within
    ``QUIET_WINDOW`` with no message: the bytes since the last event with data, but those of
    the event not yet ended (a large message is not noise)."""

    def __init__(self, events: httpx2.EventSource, session: _Session, max_event_size: int | None) -> None:
        self._events = events
        self._session = session
        self._max_event_size = max_event_size

    @property
    def response(self) -> httpx2.Response:
        return self._events.response

    async def __aiter__(self) -> AsyncIterator[httpx2.ServerSentEvent]:
        try:
            async for event in quiet_events(self.response, self._max_event_size):
                yield _at_least_floor(event)
        except StreamNoise:
            self._ended()  # as if the upstream ended it: reopened at the floor's pace

    def _ended(self) -> None:
        session = self._session
        log = logger.debug if session.warned else logger.warning
        session.warned = True
        log(
            "upstream session %s sent over %d bytes on a stream in %.0f s that made no message "
            "(comments, blank lines): the stream is ended, and reopened",
            session.label,
            QUIET_BYTES,
            QUIET_WINDOW,
            extra={"peer": session.label},
        )


class StreamNoise(Exception):
    """A stream sent over ``QUIET_BYTES`` within ``QUIET_WINDOW`` that made no message."""


def message_made() -> None:
    """Tell ``quiet_events`` that the event it last yielded made a message (in its reader's task)."""
    _MESSAGE_MADE.set(True)


async def quiet_events(
    response: httpx2.Response, max_event_size: int | None
) -> AsyncIterator[httpx2.ServerSentEvent]:
    """``response``'s events as ``EventSource`` reads them (its parser's), raising
    ``StreamNoise`` once ``QUIET_BYTES`` arrive within ``QUIET_WINDOW`` with no message: the
    bytes since the last event whose reader called ``message_made``, but those of the event
    not yet ended (a large message is not noise)."""
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "text/event-stream":
        raise httpx2.SSEError(f"Expected response with content type 'text/event-stream', got {kind!r}.")
    parser, quiet = _SSEParser(max_event_size), QuietCount("bytes")
    with request_context(request=response.request):
        async for text in response.aiter_text():
            quiet.size += len(text)  # checked once its events are read: a message forgives it
            for event in parser.decode(text):
                _MESSAGE_MADE.set(False)
                yield event
                if _MESSAGE_MADE.get():  # data that makes no message is noise too
                    quiet.message()
            if quiet.size > QUIET_BYTES:  # its parser's state read only then
                try:
                    quiet.heard(0, 0, _unfinished(parser))
                except UpstreamNoise:
                    raise StreamNoise from None
        for event in parser.flush():
            yield event


def _unfinished(parser: _SSEParser) -> int:
    """Bytes of the event ``parser`` has not ended yet (its line not ended among them)."""
    return parser._event_decoder._event_size + parser._line_decoder.pending_size  # pyright: ignore[reportPrivateUsage]


def _at_least_floor(event: httpx2.ServerSentEvent) -> httpx2.ServerSentEvent:
    if event.retry is not None and event.retry < RETRY_FLOOR_MS:
        return dataclasses.replace(event, retry=RETRY_FLOOR_MS)
    return event
