"""The SDK's legacy SSE client (``transport: sse``), held to the gateway's bounds and checks
(verified against mcp 2.3.0). ``mcp.client.sse.sse_client`` takes none of them as arguments;
it reads three of its module's globals at each use (``tests/test_compat.py`` checks), which
are replaced there, once, by ones that read the connection's own:

- ``sse_within_origin``, which opens the stream at 1 MiB an event: a 2 MiB result ended the
  stream, every call in flight on the upstream failed as "connection closed", and the
  upstream was reconnected. The bound is the upstream's ``max_message_bytes``.
- ``types`` (``mcp_types``), whose ``jsonrpc_message_adapter`` parsed each event with
  pydantic's parser: no bound of values or depth, NaN and 1e400 passed on as null. Each is
  parsed as every other transport's messages are (``parse_message``); one the gateway does
  not read answers the request it answers with why, and the session goes on.
- ``request_within_origin``, which POSTs each message and read the answer's body whole (a
  202 with 400 MiB of body took the gateway to 1 GB), and whose failure ends the SDK's writer
  alone, silently: the connection is told (``writes_ended``), so the session is lost then.
  Each POST is bounded by its sender's deadline (``_Deadlined``): one never answered held the
  SDK's writer, which sends one at a time, for its client's read timeout (300 s), every later
  message waiting behind it (each call failed after its timeout and 5 s more, the SDK's
  wait to send its cancel), the upstream reported up.

The stream itself is read through ``http_streams.quiet_events``: past ``QUIET_BYTES`` of what
makes no message (comments, blank lines, events without data) within ``QUIET_WINDOW`` the
connection is lost, saying why, and reconnected as after any other loss. Read on, comments
without end took a fifth of a core until each call's timeout (60 s), the upstream reported up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlparse
from weakref import WeakKeyDictionary

import anyio
import httpx2
import mcp_types
from httpx2 import ServerSentEvent
from mcp.client import sse
from mcp.client._transport import TransportStreams
from mcp.shared._httpx_utils import sse_within_origin, stream_within_origin
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCMessage

from agent_gateway.compat.http_streams import StreamNoise, message_made, quiet_events
from agent_gateway.compat.mcp import Unreadable, parse_message
from agent_gateway.compat.streams import StreamWrapper
from agent_gateway.errors import UpstreamUnavailable, describe
from agent_gateway.logs import clipped
from agent_gateway.noise import QUIET_BYTES, QUIET_WINDOW
from agent_gateway.shown_urls import redacted_url

logger = logging.getLogger(__name__)

Refusal = Callable[[bytes, str], SessionMessage | Exception]
"""For an event's data the gateway does not read (its edges: ``_edges``), and why: the error
answer to the request it answers, or (answering none) the error the session is told."""
WritesEnded = Callable[[str], None]
"""Told why the SDK's writer stopped: nothing more is sent on the connection."""

_NOISE = f"its stream sent over {QUIET_BYTES} bytes within {QUIET_WINDOW:g} s that made no message"

MAX_POST_ANSWER_BYTES = 65_536
"""Bytes of a POST's answer read; the rest is dropped with its HTTP connection. In this
transport the answer to a message comes on the stream: a POST's own carries nothing."""


@dataclass
class _Connection:
    url: str
    label: str
    """The upstream session, as its warnings name it."""
    event_bytes: int
    refuse: Refusal
    ended: WritesEnded
    """Told why the connection is given up (its stream's noise): the session is lost."""
    refused: str | None = None
    """Why its ``endpoint`` event was refused: the connect fails saying so."""


_OPENING: ContextVar[_Connection | None] = ContextVar("sse_connection", default=None)
"""The connection being opened, read as its stream opens and by its reader (a task started
then, in this context). Its POSTs run in each sender's context: they find theirs by client."""
_DEADLINE: ContextVar[float] = ContextVar("sse_post_deadline", default=math.inf)
"""The deadline of the task that sent the message being POSTed (its call's, the connect's):
set as it is sent, read by its POST, which runs in a copy of the sender's context."""
_WRITERS: WeakKeyDictionary[httpx2.AsyncClient, WritesEnded] = WeakKeyDictionary()
"""Who is told when a POST on each connection's HTTP client fails."""


def _bounded(
    client: httpx2.AsyncClient, url: httpx2.URL | str, *, headers: dict[str, str] | None = None, **_: Any
) -> AbstractAsyncContextManager[httpx2.EventSource | _Events]:
    opening = _OPENING.get()
    if opening is None:  # the SDK's own, outside a connection opened here
        return sse_within_origin(client, url, headers=headers)
    return _read_through(
        sse_within_origin(client, url, headers=headers, max_event_size=opening.event_bytes), opening
    )


@asynccontextmanager
async def _read_through(
    opened: AbstractAsyncContextManager[httpx2.EventSource], connection: _Connection
) -> AsyncIterator[_Events]:
    async with opened as source:
        yield _Events(source, connection)


class _Events:
    """A stream's events as the SDK's reader is given them. On its own, the reader waited out
    ``connect_timeout`` after refusing an ``endpoint`` event (its error sent to a stream
    nobody read yet: an ERROR traceback, then "no answer"); dropped the connection at a second
    one; and dropped an event of another type with a warning naming no upstream, though it
    held the answer to a call (which then waited its whole timeout)."""

    def __init__(self, source: httpx2.EventSource, connection: _Connection) -> None:
        self._source = source
        self._connection = connection
        self._endpoint: str | None = None

    @property
    def response(self) -> httpx2.Response:
        return self._source.response

    async def __aiter__(self) -> AsyncIterator[ServerSentEvent]:
        try:
            async for event in self._read():
                yield event
        except StreamNoise:  # ends the reader: the calls pending fail, saying why
            self._connection.ended(_NOISE)

    async def _read(self) -> AsyncIterator[ServerSentEvent]:
        async for event in quiet_events(self.response, self._connection.event_bytes):
            if event.event == "message":
                yield event
            elif event.event != "endpoint":
                if (answer := self._other(event)) is not None:
                    yield answer
            elif self._endpoint is not None:
                self._repeated(event.data)
            elif (refused := refused_endpoint(self._connection.url, event.data)) is not None:
                self._connection.refused = refused
                return  # the reader ends before its endpoint: the connect fails (``sse_client``)
            else:
                self._endpoint = event.data
                yield event

    def _other(self, event: ServerSentEvent) -> ServerSentEvent | None:
        """An event of another type is not for this reader (the SSE standard's word), so it
        is dropped, but for an answer to a call: that call fails at once, saying why."""
        why = f"an SSE event of type {clipped(event.event, 40)!r}, not 'message'"
        refusal = self._connection.refuse(_edges(event.data), why)  # says so, bounded
        if isinstance(refusal, Exception):  # answers nothing
            return None
        return ServerSentEvent(data=refusal.message.model_dump_json(by_alias=True, exclude_unset=True))

    def _repeated(self, data: str) -> None:
        # The 2024-11-05 transport sends one; following another would move a session's
        # messages mid-call. Kept: the first (the SDK's reader, given it, ended the stream).
        label = self._connection.label
        logger.warning(
            "upstream session %s sent another endpoint event (%s): ignored, its messages still go to the first",
            label,
            redacted_url(str(clipped(data, 200))),  # cut first: an event may be max_message_bytes long
            extra={"peer": label},
        )


def refused_endpoint(url: str, data: str) -> str | None:
    """Why the SDK's reader would refuse ``data`` as the endpoint of the stream at ``url``
    (its own checks, made first), or None."""
    try:
        endpoint = urljoin(url, data)
        ours, theirs = urlparse(url), urlparse(endpoint)
    except ValueError as exc:
        return (
            f"its endpoint event names no URL it can be read as ({clipped(redacted_url(data), 200)}: {exc})"
        )
    if (theirs.scheme, theirs.netloc) != (ours.scheme, ours.netloc):
        named = clipped(redacted_url(endpoint), 200)
        return f"its endpoint event names {named}, another origin than the stream's ({ours.scheme}://{ours.netloc})"
    return None


class _Adapter:
    """``jsonrpc_message_adapter`` as the SDK's SSE reader calls it: ``parse_message``."""

    def validate_json(self, data: bytes | str, *, by_name: bool = False) -> JSONRPCMessage:
        """Raises what ``parse_message`` raises, but ``Unreadable``: the message's refusal
        (``Refusal``) is returned instead when it answers a request (else raised)."""
        assert not by_name, "the SDK reads messages by alias"
        try:
            message = parse_message(data)
        except Unreadable as exc:
            opening = _OPENING.get()
            if opening is None:
                raise
            refusal = opening.refuse(_edges(data), str(exc))
            if isinstance(refusal, Exception):
                raise refusal from exc
            message = refusal.message
        message_made()  # read by the stream's reader, in this task (``quiet_events``)
        return message


_EDGE = 1024
"""Characters kept of each end of an event's data for its refusal, which reads the request id
there (``stdio.unread``: 512 bytes of each)."""


def _edges(data: bytes | str) -> bytes:
    """``data``'s ends, encoded: not a copy of a message of up to ``max_message_bytes``."""
    if isinstance(data, bytes):
        return data
    return (data if len(data) <= 2 * _EDGE else data[:_EDGE] + data[-_EDGE:]).encode()


class _Types:
    """``mcp_types`` as the SDK's SSE client reads it: its adapter is ``_Adapter``."""

    jsonrpc_message_adapter = _Adapter()

    def __getattr__(self, name: str) -> Any:
        return getattr(mcp_types, name)


async def _posted(
    client: httpx2.AsyncClient, method: str, url: httpx2.URL | str, **kwargs: Any
) -> httpx2.Response:
    """``request_within_origin``, reading at most ``MAX_POST_ANSWER_BYTES`` of the answer,
    within its sender's deadline (``_DEADLINE``); a failure (raised, or a status the SDK
    raises for, or no answer in time) told to the connection's ``WritesEnded``."""
    told = _WRITERS.get(client) or _untold
    response: httpx2.Response | None = None
    with anyio.CancelScope(deadline=_DEADLINE.get()) as bound:
        try:
            async with stream_within_origin(client, method, url, **kwargs) as response:
                await _drained(response)
        except Exception as exc:  # each ends the SDK's writer: told why, and raised on to it
            told(f"a POST to its message endpoint failed ({describe(exc)})")
            raise
    if bound.cancelled_caught or response is None:  # its deadline came first
        # Failed as any other POST is: every later message would wait behind this one.
        told(UNANSWERED_POST)
        raise TimeoutError(UNANSWERED_POST)
    if not response.is_success:
        told(f"its message endpoint answered a POST with HTTP {response.status_code}")
    return response


UNANSWERED_POST = "a POST to its message endpoint had no answer within its call's time"


def _untold(reason: str) -> None:
    """A POST on a client not opened here (the SDK's own use): nobody to tell."""


class _Deadlined(StreamWrapper[WriteStream[SessionMessage]]):
    """The SDK's write stream, each message sent with its sender's deadline (``_DEADLINE``),
    which bounds its POST; one sent with none (an answer to the upstream's own request, which
    the SDK sends from its reader) is given ``unbounded`` seconds: held for the SDK's read
    timeout (300 s), it held every later message behind it."""

    def __init__(self, inner: WriteStream[SessionMessage], unbounded: float) -> None:
        self._inner = inner
        self._unbounded = unbounded

    async def send(self, item: SessionMessage, /) -> None:
        deadline = anyio.current_effective_deadline()
        if deadline == math.inf:
            deadline = anyio.current_time() + self._unbounded
        token = _DEADLINE.set(deadline)
        try:
            await self._inner.send(item)  # which copies the context, the deadline in it
        finally:
            _DEADLINE.reset(token)


async def _drained(response: httpx2.Response) -> None:
    """Read ``response``'s body up to ``MAX_POST_ANSWER_BYTES`` (so its HTTP connection can be
    used again); a longer one is left unread, and closed with the response."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > MAX_POST_ANSWER_BYTES:
            return


def _install() -> None:
    sse.sse_within_origin = _bounded  # pyright: ignore[reportPrivateImportUsage]
    sse.request_within_origin = _posted  # pyright: ignore[reportPrivateImportUsage]
    sse.types = _Types()  # type: ignore[assignment]


@asynccontextmanager
async def sse_client(
    url: str,
    headers: dict[str, str],
    client_factory: Callable[..., httpx2.AsyncClient],
    max_event_bytes: int,
    refuse: Refusal,
    writes_ended: WritesEnded,
    label: str,
    unbounded: float,
) -> AsyncIterator[TransportStreams]:
    """``sse.sse_client`` whose events may be ``max_event_bytes`` long each and are parsed as
    ``parse_message`` parses (one it does not read: ``refuse``); ``writes_ended`` is told why
    when a POST fails (the SDK then sends nothing more on the connection); ``label``: the
    upstream session, as its warnings name it; ``unbounded``: the seconds a POST sent with no
    deadline may take.

    Raises:
        UpstreamUnavailable: the stream's ``endpoint`` event named another origin, or no URL.
    """
    _install()

    def watched_client(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        client = client_factory(headers=headers, timeout=timeout, auth=auth)
        _WRITERS[client] = writes_ended
        return client

    connection = _Connection(url, label, max_event_bytes, refuse, writes_ended)
    token = _OPENING.set(connection)  # read on entering, and by the reader
    try:
        async with sse.sse_client(url, headers=headers, httpx_client_factory=watched_client) as (
            reads,
            writes,
        ):
            yield reads, _Deadlined(writes, unbounded)
    except Exception as exc:  # with no endpoint, the SDK's "child exited without started"
        if connection.refused is None:
            raise
        raise UpstreamUnavailable(label, connection.refused) from exc
    finally:
        _OPENING.reset(token)
