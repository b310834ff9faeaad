"""How a handshake-era ``POST`` is answered: one JSON body, unless the call has something to stream.

The SDK's handshake-era transport answers every request with an SSE stream, even the
(overwhelmingly common) call that sends nothing before its result. That stream costs both ends:
a response task group of four tasks on the gateway, an SSE parser on the client; in
``bench/overhead.py`` it was a third of the gateway's CPU per call and about 0.7 ms of the
client's. The spec lets the server pick JSON or a stream per request (the SDK's modern-era path
defers the choice); so does this, in the handshake era: the response waits for the call's first
message. A result alone goes back as JSON; anything before it (progress, a log line, a sampling
or elicitation request) commits the stream, as does ``PING_INTERVAL`` of silence (the SDK's
keepalive). Everything else stays the SDK's: sessions, validation, error answers, resumability.
With an event store (several replicas) every message is still stored, and a call that streams
carries its events' ids, so a dropped stream resumes; what is not sent is the SDK's priming
event (none exists before its first event here, and a POST dropped unanswered is retried).

In ``compat/``: built of the SDK transport's private state (``tests/test_compat.py`` lists each),
it swaps the class of FastMCP's session manager and of each transport it makes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from http import HTTPStatus
from typing import cast

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from fastmcp.server.http import FastMCPStreamableHTTPSessionManager
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.connection import Connection
from mcp.server.streamable_http import (
    CONTENT_TYPE_SSE,
    MCP_SESSION_ID_HEADER,
    REQUEST_CANCELLED,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from agent_gateway.body_shape import message_of
from agent_gateway.compat import exchange
from agent_gateway.compat.exchange import ModernLane
from agent_gateway.compat.headers import names_json
from agent_gateway.compat.lane import (
    Answering,
    Committing,
    Outcome,
    Route,
    Unanswered,
    encoded,
    json_answer,
    json_body,
    refused_twice,
    refused_while_draining,
    route_of,
)
from agent_gateway.compat.replay import ReplayFromStore
from agent_gateway.downstream.keepalive import Keepalive
from agent_gateway.limits import PARSED
from agent_gateway.tally import http_answers

logger = logging.getLogger(__name__)

PING_INTERVAL = EventSourceResponse.DEFAULT_PING_INTERVAL
"""Seconds a silent call may keep its answer waiting before the stream is committed."""

_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("ascii")
EventReader = MemoryObjectReceiveStream[EventMessage]
_KEEPALIVE: SSEEvent = {"comment": "keepalive"}
"""Sent first when a silent call's answer becomes a stream, as the SDK's modern path pings."""


class DeferredStreamTransport(ReplayFromStore):
    """The SDK's handshake-era server transport, answering a silent call with JSON (and a GET's
    ``Last-Event-ID`` only with a store: ``replay.py``)."""

    manager: DeferredSessionManager
    """The session manager that made it: where its requests are served (``routes``), the
    keepalive that watches them, the task group that writes the streams the lane commits."""
    _served: set[anyio.CancelScope]
    """The calls served in their POSTs' tasks, cancelled when the session ends."""
    answering: Answering

    def _check_content_type(self, request: Request) -> bool:
        return names_json(request.headers.get("content-type", ""))  # the SDK's, but in any case

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        message = await self._deferrable(request)
        if message is None:  # not a plain request: the SDK's path answers it (and its errors)
            await super()._handle_post_request(scope, request, receive, send)
            return
        if not await self._validate_request_headers(request, send):
            return
        try:
            with self.answering.taken(message.id) as free:
                await (self._answer(message, request, send) if free else refused_twice(message.id, send))
        except Exception as exc:  # the SDK's top-level answer for a POST it failed to serve
            logger.exception("error answering POST")
            await self._create_error_response(
                "Error handling POST request", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
            )(scope, receive, send)
            if self._read_stream_writer is not None:
                await self._read_stream_writer.send(exc)

    async def _deferrable(self, request: Request) -> JSONRPCRequest | None:
        """The request in this POST when its answer can wait, else None."""
        if self.is_json_response_enabled:
            return None
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse and self._check_content_type(request)):
            return None
        try:
            message = message_of(await request.body(), request.scope.get(PARSED))
        except (ValueError, ValidationError):
            return None
        if not isinstance(message, JSONRPCRequest) or message.method == "initialize":
            return None
        return message

    async def _answer(self, message: JSONRPCRequest, request: Request, send: Send) -> None:
        session_id = self.mcp_session_id
        route = self.manager.routes(session_id) if session_id is not None and not self._terminated else None
        if route is not None:
            await self._served_here(route, message, request, send)
            return
        writer = self._read_stream_writer
        assert writer is not None, "connect() runs before any request is served"
        request_id = str(message.id)
        streams = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        self._request_streams[request_id] = streams
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
        await writer.send(self._create_session_message(message, request, request_id, version))
        first, ended = await _first_event(streams[1])
        if first is not None and _plain_answer(first):
            http_answers.add(1, {"form": "json"})
            await self._clean_up_memory_streams(request_id)
            await self._send_json(encoded(first.message), send)
            return
        # Commit the stream: with the first message, or (silent so far) a keepalive at once.
        # A session that ended meanwhile gets an empty stream, as the SDK's would end: the
        # client reads "connection closed", not an HTTP error.
        form = "stream" if first is not None else "ended" if ended else "idle"
        http_answers.add(1, {"form": form})
        await self._committed(request_id, request, send, _Prepended(first, streams[1]), form)

    async def _served_here(self, route: Route, message: JSONRPCRequest, request: Request, send: Send) -> None:
        """``message`` handled in this task (``compat/lane.py``). Its answer is JSON, unless
        the call sends the client something first or stays silent past the keepalive interval:
        that commits the stream, and the answer follows on it."""
        request_id = str(message.id)
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
        metadata = self._create_session_message(message, request, request_id, version).metadata
        assert isinstance(metadata, ServerMessageMetadata)
        host = self.manager._task_group  # pyright: ignore[reportPrivateUsage]
        assert host is not None, "run() is entered before any request"
        started = partial(self._committed, request_id, request, send)
        stream = Committing(host, request_id, self._request_streams, self._sse_stream_writers, started)
        scope = anyio.CancelScope()  # the client's cancel cancels it, and the session's end
        self._served.add(scope)
        try:
            quiet = self.manager.keepalive.watch(stream.idle)
            try:
                outcome = await route.serve(message, metadata, stream.commit, scope)
            finally:
                quiet.end()  # the keepalive may commit the stream until the call is done
            await self._settle(route, message.id, outcome, stream, metadata, send)
        finally:
            self._served.discard(scope)
            await stream.finished()
            stream.forget()

    async def _settle(
        self,
        route: Route,
        request_id: RequestId,
        outcome: Outcome,
        stream: Committing,
        metadata: ServerMessageMetadata,
        send: Send,
    ) -> None:
        """Send ``outcome``: on the stream if committed, else as one JSON body. A call the
        client cancelled is answered on a stream, as the SDK's path answers it; a call whose
        session ended meanwhile gets an empty stream (the client reads "connection closed")."""
        if outcome is Unanswered.ENDED:
            stream.commit("ended")
            stream.end()
        elif outcome is Unanswered.CANCELLED:
            stream.commit("stream")
            if metadata.on_request_unanswered is not None:
                try:  # as the dispatcher settles an unanswered request: a failure is only logged
                    await metadata.on_request_unanswered()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    logger.debug("on_request_unanswered dropped: connection closing")
                except Exception:
                    logger.exception("on_request_unanswered raised")
        elif stream.committed:
            await route.write(request_id, outcome)
        else:
            http_answers.add(1, {"form": "json"})
            await self._send_json(json_body(request_id, outcome), send)

    async def _send_json(self, body: bytes, send: Send) -> None:
        """``body``, one JSON-RPC answer, as the SDK's ``_create_json_response`` sends it."""
        session = (
            [(MCP_SESSION_ID_HEADER.encode(), self.mcp_session_id.encode())] if self.mcp_session_id else []
        )
        await json_answer(send, body, headers=session)

    async def _committed(
        self, request_id: str, request: Request, send: Send, events: _Prepended | EventReader, form: str
    ) -> None:
        """A committed stream written: after a keepalive if committed for silence."""
        await self._stream(request_id, request, send, events, _KEEPALIVE if form == "idle" else None)

    def end_served(self) -> None:
        """Cancel the calls served in their POSTs' tasks: their session has ended."""
        for scope in self._served:
            scope.cancel()

    async def terminate(self) -> None:
        self.end_served()
        await super().terminate()

    async def _stream(
        self,
        request_id: str,
        request: Request,
        send: Send,
        events: _Prepended | EventReader,
        lead: SSEEvent | None,
    ) -> None:
        """Commit ``text/event-stream`` and write the call's messages, the SDK's way."""
        sse_writer, sse_reader = anyio.create_memory_object_stream[SSEEvent](0)
        self._sse_stream_writers[request_id] = sse_writer
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": CONTENT_TYPE_SSE,
            **({MCP_SESSION_ID_HEADER: self.mcp_session_id} if self.mcp_session_id else {}),
        }
        writing = partial(self._run_sse_writer, request_id, sse_writer, cast(EventReader, events), lead)
        response = EventSourceResponse(content=sse_reader, data_sender_callable=writing, headers=headers)
        try:
            await response(request.scope, request.receive, send)
        except Exception:  # the headers may be out: no error answer now, as in the SDK
            logger.exception("SSE response error")
            await sse_writer.aclose()
            await self._clean_up_memory_streams(request_id)
        finally:
            await sse_reader.aclose()


def _plain_answer(event: EventMessage) -> bool:
    """Whether ``event`` is the call's own result (or error), to be sent as one JSON body.

    The SDK's answer to a cancelled call stays on a stream: the client gave the call up
    and may be closing, and the SDK's client drops a late message it reads from a stream
    but fails on one in a JSON body (its read side is already closed).
    """
    message = event.message
    if isinstance(message, JSONRPCError):
        return message.error.code != REQUEST_CANCELLED
    return isinstance(message, JSONRPCResponse)


class _Prepended:
    """A request's event stream with the event already taken from it put back in front."""

    def __init__(self, first: EventMessage | None, rest: EventReader) -> None:
        self._first = first
        self._rest = rest

    async def __aenter__(self) -> _Prepended:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._rest.aclose()

    def __aiter__(self) -> _Prepended:
        return self

    async def __anext__(self) -> EventMessage:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()


async def _first_event(reader: EventReader) -> tuple[EventMessage | None, bool]:
    """The call's first message, or None after ``PING_INTERVAL``; and whether its stream ended.

    A client that hangs up meanwhile is not watched for: in this era a disconnect does not
    cancel the call, and its answer is dropped when written, as the SDK's stream drops it.
    """
    with anyio.move_on_after(PING_INTERVAL):
        try:
            return await reader.receive(), False
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None, True
    return None, False


class DeferredSessionManager(FastMCPStreamableHTTPSessionManager):
    """FastMCP's session manager, with each new session on ``DeferredStreamTransport`` and
    each modern-era request served in its POST's task (``compat/exchange.py``)."""

    connections: Callable[[str], Connection | None]
    keepalive: Keepalive
    modern: ModernLane
    draining: bool

    async def _by_era(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The SDK's routing by the protocol-version header, with its modern entry replaced."""
        if self.draining and scope["method"] == "GET":
            await refused_while_draining(send)
            return
        version = next((v for k, v in scope["headers"] if k == _VERSION_HEADER), None)
        host = self._task_group
        if version is None or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS or host is None:
            await self._handle_request(scope, receive, send)
            return
        await self.modern.serve(self._lifespan_state, host, scope, receive, send)

    def drain(self) -> None:
        """End every session's notification stream (its ``GET``) and refuse new ones: their
        clients reconnect, to another replica, instead of holding the drain until
        ``drain_timeout``. Calls in flight go on, their streams included."""
        self.draining = True
        for transport in list(self._server_instances.values()):
            transport.close_standalone_sse_stream()

    def routes(self, session_id: str) -> Route | None:
        """Where ``session_id``'s requests are served in their POSTs' tasks (None: on the
        SDK's loop, e.g. before the gateway has seen the session)."""
        connection = self.connections(session_id)
        transport = self._server_instances.get(session_id)
        if connection is None or not isinstance(transport, DeferredStreamTransport):
            return None
        return route_of(connection, self.app, self._lifespan_state, transport.end_served)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            deferring(transport, self)
        return transport


def deferring(transport: StreamableHTTPServerTransport, manager: DeferredSessionManager) -> None:
    """Make ``transport`` (the SDK's, just built) a ``DeferredStreamTransport`` of ``manager``'s.
    The subclass adds behaviour and the state set here: the SDK has no transport factory to pass."""
    transport.__class__ = DeferredStreamTransport
    deferred = cast(DeferredStreamTransport, transport)
    deferred.manager = manager
    deferred._served = set()
    deferred.answering = Answering()


def defer_responses(manager: object, connections: Callable[[str], Connection | None]) -> list[Keepalive]:
    """Make ``manager`` (FastMCP's, once its app has started) answer silent calls with JSON,
    serving a session's requests, and every modern-era request, in their POSTs' tasks
    (``connections``: a live session's connection by its id).

    Returns the keepalives the caller runs while requests are served; none, leaving every
    answer to the SDK, for a manager of another kind.
    """
    if type(manager) is not FastMCPStreamableHTTPSessionManager:
        logger.warning("session manager %s not recognised: answering every call with SSE", type(manager))
        return []
    manager.__class__ = DeferredSessionManager
    deferred = cast(DeferredSessionManager, manager)
    deferred.connections = connections
    deferred.draining = False
    deferred.keepalive = Keepalive(PING_INTERVAL)
    watching = exchange.watches()
    deferred.modern = ModernLane(deferred.app, deferred.security_settings, deferred.json_response, watching)
    # The SDK binds its routing method into the app it serves with as it makes the manager.
    deferred.asgi_app = RequestBodyLimitMiddleware(deferred._by_era, deferred.max_request_body_size)
    return [deferred.keepalive, watching]
