"""A handshake-era request served in the task of the POST that carries it.

The SDK serves a session's requests from one loop: the POST puts the request on the
session's read stream, the dispatcher's loop takes it and starts a task for it, the task
runs the server's handler and writes the answer to the write stream, the transport's
router task takes it from there and hands it to the POST's stream, and the POST task
finally answers. Three task switches, a task started and two pydantic models of the
answer for each call (``bench/README.md``: about a tenth of the gateway's CPU per call).

Here the POST task runs the server's handler itself (``ServerRunner.on_request``, the same
middleware and handlers), registered in the dispatcher's table of requests in flight
exactly as the dispatcher registers one, so the client's ``notifications/cancelled``
cancels it by its id, and with the dispatcher's per-request context, so what the handler
sends the client (progress, log lines, sampling and elicitation requests) is the SDK's
frames on the SDK's channels. The context tells the transport before the first such message
(``InlineContext.opening``): the transport then commits the POST's SSE stream, as it does
for a request served on the SDK's path.

It lives in ``compat/`` because it is built of the dispatcher's private members
(``_in_flight``, ``_InFlight``, ``_JSONRPCDispatchContext``, ``_transport_builder``,
``_running``, ``_write_result``, ``_write_error``) and the transport's maps of request
streams and their writers (``Committing``); ``tests/test_compat.py`` checks each. The
transport's side is ``compat/deferred.DeferredStreamTransport._served_here``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from http import HTTPStatus
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import ServerRunner
from mcp.server.streamable_http import REQUEST_STREAM_BUFFER_SIZE, EventMessage
from mcp.shared.dispatcher import CallOptions, OnRequest, coerce_request_id
from mcp.shared.jsonrpc_dispatcher import (
    JSONRPCDispatcher,
    _InFlight,  # pyright: ignore[reportPrivateUsage]
    _JSONRPCDispatchContext,  # pyright: ignore[reportPrivateUsage]
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp.shared.message import MessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)
from starlette.types import Send

from agent_gateway.errors import shown
from agent_gateway.runtime import CLEANUP_TIMEOUT
from agent_gateway.tally import http_answers

logger = logging.getLogger(__name__)


class Unanswered(Enum):
    """Why a request served in its POST's task has no answer of its own."""

    CANCELLED = "cancelled by the client"
    ENDED = "its session ended"


Outcome = dict[str, Any] | ErrorData | Unanswered
"""A request's result, its error, or why it has neither."""
_ROUTE_KEY = "agent_gateway.lane"
Headers = Sequence[tuple[bytes, bytes]]
StartStream = Callable[[MemoryObjectReceiveStream[EventMessage], str], Coroutine[Any, Any, None]]
"""Writes a committed stream: its events as they come, and the form it was committed in
(``stream``: a message to send; ``idle``: silence; ``ended``: the session ended)."""


@dataclass
class InlineContext(_JSONRPCDispatchContext[TransportContext]):
    """The dispatcher's context for one request, which calls ``opening`` before the request
    sends the client its first message."""

    opening: Callable[[], None] = field(default=lambda: None)

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        if not self._closed:
            self.opening()
        await super().notify(method, params, opts)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        if self.can_send_request:
            self.opening()
        return await super().send_raw_request(method, params, opts)


@dataclass(frozen=True)
class Route:
    """Where a session's requests are served in their POST's task: its dispatcher and runner."""

    dispatcher: JSONRPCDispatcher[TransportContext]
    on_request: OnRequest

    async def serve(
        self,
        message: JSONRPCRequest,
        metadata: MessageMetadata,
        opening: Callable[[], None],
        scope: anyio.CancelScope,
    ) -> Outcome:
        """``message`` handled as the dispatcher's ``_handle_request`` handles it, with the
        same exception-to-error rules, within ``scope`` (the client's cancel cancels it, and
        the caller cancels it when the session ends); its outcome is left to the caller to send."""
        dispatcher = self.dispatcher
        try:
            transport = dispatcher._transport_builder(metadata)  # pyright: ignore[reportPrivateUsage]
        except Exception:  # as the dispatcher answers it: this request fails, not the POST
            logger.exception("transport_builder raised; rejecting request %r", message.id)
            return ErrorData(code=INTERNAL_ERROR, message="transport context unavailable")
        dctx = InlineContext(
            transport=transport,
            _dispatcher=dispatcher,
            _request_id=message.id,
            message_metadata=metadata,
            _progress_token=progress_token_from_params(message.params),
            opening=opening,
        )
        key = coerce_request_id(message.id)
        in_flight = dispatcher._in_flight  # pyright: ignore[reportPrivateUsage]
        in_flight[key] = _InFlight(scope=scope, dctx=dctx)
        outcome: Outcome = Unanswered.ENDED
        with scope:
            try:
                outcome = await self.on_request(dctx, message.method, message.params)
            except Exception as exc:
                error = handler_exception_to_error_data(exc)
                if error is None:  # the dispatcher answers code 0, which JSON-RPC does not define
                    logger.exception("handler for %r raised", message.method)
                    error = ErrorData(code=INTERNAL_ERROR, message="Internal server error")
                outcome = error
            finally:
                dctx.close()
                if (entry := in_flight.get(key)) is not None and entry.dctx is dctx:
                    del in_flight[key]
        return Unanswered.CANCELLED if dctx.cancel_requested.is_set() else outcome

    async def write(self, request_id: RequestId, outcome: dict[str, Any] | ErrorData) -> None:
        """``outcome`` written as the dispatcher writes an answer (to the session's stream)."""
        if isinstance(outcome, ErrorData):
            await self.dispatcher._write_error(request_id, outcome)  # pyright: ignore[reportPrivateUsage]
        else:
            await self.dispatcher._write_result(request_id, outcome)  # pyright: ignore[reportPrivateUsage]


def route_of(
    connection: Connection, server: Server[Any], lifespan_state: Any, on_end: Callable[[], None]
) -> Route | None:
    """The route of ``connection``'s requests; None until its handshake is done (the SDK's
    loop holds a request pipelined behind ``initialize`` until then), when its loop is not
    the SDK's dispatcher, or when that no longer runs. ``on_end`` is called as the connection
    ends, before what it holds is released, as the SDK's loop cancels its handlers then."""
    dispatcher = connection.outbound
    if (
        not connection.initialize_accepted
        or not isinstance(dispatcher, JSONRPCDispatcher)
        or not dispatcher._running  # pyright: ignore[reportPrivateUsage]
    ):
        return None
    route = connection.state.get(_ROUTE_KEY)
    if not isinstance(route, Route) or route.dispatcher is not dispatcher:
        runner = ServerRunner(server, connection, lifespan_state)
        route = Route(dispatcher, runner.on_request)  # pyright: ignore[reportUnknownArgumentType]
        connection.state[_ROUTE_KEY] = route
        connection.exit_stack.callback(on_end)
    return route


class Hosted:
    """One task a POST runs in ``host``, a task group as long-lived as the session manager,
    rather than in a task group of its own: a task group per call cost a checkpoint per call,
    for the few calls that need a second task (a stream's writer, a hang-up's watcher). The
    POST waits for it, or stops it, before it returns (the ASGI app must not return while
    the task writes). Starting it raises once ``host`` has ended."""

    def __init__(
        self,
        host: TaskGroup,
        work: Callable[[], Coroutine[Any, Any, None]],
        what: str,
        context: contextvars.Context | None = None,
    ) -> None:
        """``work``: the task; ``what``: its name in a log line if it fails; ``context``: the
        context it runs in (default: the starting task's)."""
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._what = what
        (context or contextvars.copy_context()).run(host.start_soon, self._run, work)

    @property
    def stopped(self) -> bool:
        """Whether the POST stopped it (``stop``, or ``finished`` cancelled)."""
        return self._scope.cancel_called

    async def _run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            with self._scope:
                await work()
        except Exception:  # the host is the session manager's: one call's failure stays its own
            logger.exception("%s failed", self._what)
        finally:
            self._done.set()

    async def finished(self) -> None:
        """Wait until the task is done; stop it if this task is cancelled meanwhile."""
        try:
            await self._done.wait()
        finally:
            if not self._done.is_set():
                await self.stop()

    async def stop(self) -> None:
        """Cancel the task and wait (bounded, shielded) until it has ended."""
        self._scope.cancel()
        with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            await self._done.wait()


class Committing:
    """The SSE stream of a POST whose request is served in the POST's task, committed once:
    before the call's first message to the client, after the keepalive interval of silence,
    or to carry an answer the SDK sends on a stream. The transport's router then feeds it
    through ``request_streams`` as it feeds any request's stream.

    Its writer runs in ``host`` (``Hosted``); the POST waits for it (``finished``) before it
    returns."""

    def __init__(
        self,
        host: TaskGroup,
        request_id: str,
        request_streams: dict[Any, Any],
        writers: dict[Any, Any],
        start: StartStream,
    ) -> None:
        """``request_streams``, ``writers``: the transport's maps of request streams and of
        their SSE writers; ``start``: writes the stream, in a task of ``host``."""
        self._host = host
        self._request_id = request_id
        self._request_streams = request_streams
        self._writers = writers
        self._start = start
        self.committed = False
        self._context = contextvars.copy_context()
        """The POST's: the stream's task runs in it, whichever task commits it."""
        self._streams: object = None
        self._writer: Hosted | None = None

    def idle(self) -> None:
        self.commit("idle")

    def commit(self, form: str = "stream") -> None:
        """Start the stream (once)."""
        if self.committed:
            return
        self.committed = True
        http_answers.add(1, {"form": form})
        streams = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        self._request_streams[self._request_id] = self._streams = streams
        what = f"the stream of request {self._request_id}"
        self._writer = Hosted(self._host, partial(self._start, streams[1], form), what, self._context)

    async def finished(self) -> None:
        """Wait until the stream (if committed) is written; stop its writer if this task is
        cancelled meanwhile."""
        if self._writer is not None:
            await self._writer.finished()

    def end(self) -> None:
        """End the stream with nothing more on it."""
        streams = self._request_streams.get(self._request_id)
        if streams is not None:
            streams[0].close()

    def forget(self) -> None:
        """Drop what the transport still holds of this stream (the POST's task was cancelled
        before its writer ran; the writer clears both itself once it has run)."""
        if self._streams is not None and self._request_streams.get(self._request_id) is self._streams:
            self._request_streams.pop(self._request_id, None)
            self._writers.pop(self._request_id, None)


def encoded(message: JSONRPCMessage) -> bytes:
    """``message`` as the SDK's ``_create_json_response`` writes it, serialised straight to
    bytes by msgspec: the SDK's JSON text and then its encoding hold a large answer twice
    more (an 80 MB answer: +160 MB at the peak, against +80)."""
    return msgspec.json.encode(message.model_dump(mode="json", by_alias=True, exclude_unset=True))


async def json_answer(send: Send, body: bytes, status: int = 200, headers: Headers = ()) -> None:
    """``body``, one JSON-RPC answer, as the SDK sends one: its length, then ``headers``."""
    start = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


def json_body(request_id: RequestId, outcome: dict[str, Any] | ErrorData) -> bytes:
    """The JSON-RPC answer to ``request_id``, as ``encoded`` writes it."""
    if isinstance(outcome, ErrorData):
        return encoded(JSONRPCError(jsonrpc="2.0", id=request_id, error=outcome))
    try:  # a spec method's result is JSON-ready already (the runner serialised it)
        return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "result": outcome})
    except (TypeError, msgspec.EncodeError):  # an object only pydantic can write
        return encoded(JSONRPCResponse(jsonrpc="2.0", id=request_id, result=outcome))


class Answering:
    """The ids of one session's requests being answered, as the SDK's dispatcher tells ids
    apart (``"7"`` is ``7``). A second request under an id still being answered took the
    first's place in the SDK's tables: one answer was written to both POSTs' stream, the
    other lost, and its POST never ended, pinning its session (which never makes room with a
    request in flight) until the client hung up."""

    def __init__(self) -> None:
        self._ids: set[RequestId] = set()

    @contextmanager
    def taken(self, request_id: RequestId) -> Iterator[bool]:
        """Whether ``request_id`` is free, held for the block when it is."""
        key = coerce_request_id(request_id)
        if key in self._ids:
            yield False
            return
        self._ids.add(key)
        try:
            yield True
        finally:
            self._ids.discard(key)


async def refused_twice(request_id: RequestId, send: Send) -> None:
    """The answer to a request whose id is being answered already in its session."""
    message = f"request id {shown(str(request_id))} is already in flight in this session"
    error = ErrorData(code=INVALID_REQUEST, message=message)
    await json_answer(send, json_body(request_id, error), status=400)


async def refused_while_draining(send: Send) -> None:
    """A draining replica's answer to a GET (a notification stream it would hold past its
    stop). The connection closes after it: the client's next try reaches a listening replica."""
    headers = [(b"content-length", b"0"), (b"connection", b"close"), (b"retry-after", b"1")]
    await send({"type": "http.response.start", "status": HTTPStatus.SERVICE_UNAVAILABLE, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
