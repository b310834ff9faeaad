"""A modern-era request served in the task of the POST that carries it.

The SDK's modern entry (``handle_modern_request``) runs each request's handler in a task
group of its own, beside a second task that waits for the client to hang up, passes what
the handler sends through a memory stream, and writes the answer as a pydantic model
through a Starlette response: two tasks, a task group, a stream and two dumps of the answer
per call, about a tenth of the gateway's CPU per call (``bench/README.md``).

Here the POST's task runs the same checks (the SDK's own functions, in its order) and the
same runner (``serve_one``'s: every middleware, validation and seal applies), and writes the
answer itself: one JSON body straight from the handler's dict when the call sent nothing
first, else the SDK's ``text/event-stream`` frames, committed by the call's first message.
Anything that is not a plain request the checks pass (a notification, a batch, a malformed
envelope or header, ``subscriptions/listen``) goes to the SDK's entry, which answers it and
its errors as it always has.

Hanging up is how a modern client cancels, and only a task waiting on ``receive`` sees it.
A watcher task per call was what made an earlier version of this measure no better than
the SDK's entry, so a call is watched only once it has run ``WATCH_AFTER``
(``downstream/keepalive``: one task for all calls starts the watcher): the calls that answer
sooner, nearly all of them, never start a task, and a hang-up reaches a longer call's
upstream within ``WATCH_AFTER`` and a little (a call that ends sooner runs to its end, its
answer written to nobody). The watcher also pings a stream silent for ``PING_INTERVAL``,
committing it first, as the SDK's entry does. In JSON-response mode (no stream, no pings)
a hang-up cancels a long call too, where the SDK's entry would run it to its end.

It lives in ``compat/`` because it calls the SDK's private entry and helpers
(``_mcp_param_rejection``, ``_sse_event``, ``_SSE_HEADERS``, ``_SSE_PING_INTERVAL``,
``_SingleExchangeDispatchContext``); ``tests/test_compat.py`` checks each.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.server import _streamable_http_modern as sdk  # pyright: ignore[reportPrivateUsage]
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import ServerRunner, aclose_shielded, modern_error_data
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.dispatcher import CallOptions
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    INVALID_REQUEST,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from agent_gateway import json_text
from agent_gateway.compat.headers import IndexedRequest
from agent_gateway.compat.lane import Hosted, json_answer, json_body
from agent_gateway.compat.stdlib import holds_callbacks
from agent_gateway.downstream.keepalive import Keepalive
from agent_gateway.limits import CHECKS_REFUSED, PARSED
from agent_gateway.request_body import replay
from agent_gateway.tally import http_answers

logger = logging.getLogger(__name__)

PING_INTERVAL: float = sdk._SSE_PING_INTERVAL  # pyright: ignore[reportPrivateUsage]
"""Seconds of silence before a call's answer becomes a stream, and between its pings."""
WATCH_AFTER = 0.25
"""Seconds a call runs before its POST is watched for the client hanging up."""
_SSE_HEADERS: list[tuple[bytes, bytes]] = sdk._SSE_HEADERS  # pyright: ignore[reportPrivateUsage]
_PING = b": ping\r\n\r\n"
PARAMS_SENT: ContextVar[bool] = ContextVar("agent_gateway_params_sent", default=True)
"""Whether the modern ``tools/call`` whose ``Mcp-Param-*`` headers are checked sent any."""


def watches() -> Keepalive:
    """The queue that starts each long call's watcher (run it while requests are served)."""
    return Keepalive(WATCH_AFTER, slack=WATCH_AFTER / 2)


class ModernLane:
    """A session manager's modern-era requests, served as the SDK's entry serves them."""

    def __init__(
        self,
        server: Server[Any],
        settings: TransportSecuritySettings | None,
        json_response: bool,
        watching: Keepalive,
    ) -> None:
        self._server = server
        self._settings = settings
        self._security = TransportSecurityMiddleware(settings)
        self._json_response = json_response
        self._watching = watching

    async def serve(
        self, lifespan_state: Any, host: TaskGroup, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Answer one POST; ``host``: a task group as long-lived as the session manager,
        where a long call's watcher runs."""
        request = IndexedRequest(scope, receive)
        body = await request.body() if scope["method"] == "POST" else b""
        try:
            admitted = await self._admitted(request, body, lifespan_state)
        except _NotAcceptable as refusal:  # the SDK's entry answers an empty 406 here
            _checks_refused(scope, str(refusal))
            await json_answer(send, refusal.body, 406)
            return
        if isinstance(admitted, str):
            _checks_refused(scope, admitted)
            admitted = None
        if admitted is None:  # the SDK's entry answers it, its errors included
            await sdk.handle_modern_request(
                self._server,
                self._settings,
                self._json_response,
                lifespan_state,
                scope,
                replay(body, receive),
                send,
            )
            return
        message, route = admitted
        exchange = Exchange(host, receive, send, streams=not self._json_response)
        context = ExchangeContext(
            transport=TransportContext(
                kind="streamable-http", can_send_request=False, headers=request.headers
            ),
            request_id=message.id,
            message_metadata=ServerMessageMetadata(request_context=request),
            progress_token=progress_token_from_params(message.params),
            exchange=exchange,
        )
        connection = Connection.from_envelope(
            route.protocol_version, route.client_info, route.client_capabilities
        )
        work = _served(ServerRunner(self._server, connection, lifespan_state), context, message)
        await exchange.answer(message.id, work, self._watching)

    async def _admitted(
        self, request: IndexedRequest, body: bytes, lifespan_state: Any
    ) -> tuple[JSONRPCRequest, InboundModernRoute] | str | None:
        """The request in ``body`` and its route when every check of the SDK's entry passes,
        in its order; else what the SDK's entry answers it with: why a check refused it, or
        None for anything that is not a plain request (a notification, a batch, malformed)."""
        if request.method != "POST":
            return None
        if (refused := await self._security.validate_request(request, is_post=True)) is not None:
            return f"HTTP {refused.status_code}: {bytes(refused.body).decode(errors='replace')}"
        has_json, has_sse = check_accept_headers(request)
        if not has_json or not (self._json_response or has_sse):
            raise _NotAcceptable(self._json_response)
        try:
            parsed = request.scope.get(PARSED)  # admission's, when it parsed this very body
            decoded = parsed[1] if parsed is not None and parsed[0] == body else json_text.parsed(body)
            message = JSONRPCRequest.model_validate(decoded) if "id" in decoded else None
        except (ValueError, RecursionError, TypeError, ValidationError):
            return None
        if message is None or message.method == "subscriptions/listen":
            return None
        headers = request.headers
        if headers.repeated and (twice := find_duplicated_routing_header(headers.items())) is not None:
            return f"the {twice} header given twice"
        route = classify_inbound_request(decoded, headers=headers.first)
        if not isinstance(route, InboundModernRoute):
            return route.message
        sent = PARAMS_SENT.set(any(n.lower().startswith("mcp-param-") for n in headers.first))
        try:
            rejection = await sdk._mcp_param_rejection(self._server, request, message, route, lifespan_state)  # pyright: ignore[reportPrivateUsage]
        finally:
            PARAMS_SENT.reset(sent)
        return (message, route) if rejection is None else rejection.message


def _checks_refused(scope: Scope, why: str) -> None:
    """Admission records a request the checks refused, as one it refused itself: a request
    only (admission parsed its body: it has an id), not a notification, which is no call."""
    if PARSED in scope:
        scope[CHECKS_REFUSED] = why


class Exchange:
    """One modern POST's answer, written by the task serving it: one JSON body, or a
    stream committed by the call's first message or by ``PING_INTERVAL`` of silence."""

    def __init__(self, host: TaskGroup, receive: Receive, send: Send, *, streams: bool) -> None:
        """``streams``: whether the answer may be a stream (not in JSON-response mode, where
        the call's messages are dropped, as the SDK drops them)."""
        self._host = host
        self._receive = receive
        self._send = send
        self.streams = streams
        self.call = anyio.CancelScope()
        """The call's scope, cancelled when the client hangs up."""
        self.streaming = False
        self.hung_up = False
        self._done = False
        self._written_at = time.monotonic()
        self._lock: anyio.Lock | None = None
        self._watcher: Hosted | None = None

    async def answer(
        self, request_id: RequestId, work: Awaitable[dict[str, Any]], watching: Keepalive
    ) -> None:
        """Run ``work`` (the call) and write its outcome; nothing when the client hung up."""
        watch = watching.watch(self.watch)
        outcome: dict[str, Any] | ErrorData | None = None
        try:
            with self.call:
                try:
                    outcome = await work
                except Exception as exc:  # the SDK's boundary: nothing internal reaches the wire
                    outcome = modern_error_data(exc)
        finally:
            self._done = True
            watch.end()
            if self._watcher is not None:
                await self._watcher.stop()
        if outcome is not None and not self.hung_up:
            await self._reply(request_id, outcome)

    def watch(self) -> None:
        """Start waiting for the client to hang up (the call has run ``WATCH_AFTER``)."""
        if self._done:
            return
        try:
            self._watcher = Hosted(self._host, self._watch, "watching a modern-era call")
        except RuntimeError:  # the host has ended: the server is stopping, and so is the call
            self.call.cancel()

    async def notify(self, event: bytes) -> None:
        """Send the client one of the call's messages (committing the stream first); dropped
        once the call has ended (a relay's task may still be sending one)."""
        if self.streams:
            await self._stream(event, "stream")

    async def _watch(self) -> None:
        try:
            while True:
                with anyio.move_on_after(self._quiet_for()):
                    while (await self._receive())["type"] != "http.disconnect":
                        pass
                    logger.debug("the client hung up: its call is cancelled")
                    http_answers.add(1, {"form": "abandoned", "mcp.era": "modern"})
                    self.hung_up = True
                    self.call.cancel()
                    return
                if self._quiet_for() == 0:  # not when the call sent something meanwhile
                    await self._stream(_PING, "idle")
        finally:
            if self._watcher is not None and not self._watcher.stopped:  # its host is ending
                self.call.cancel()

    def _quiet_for(self) -> float:
        """Seconds until a silent stream's next ping is due (never, when it cannot stream)."""
        if not self.streams:
            return math.inf
        return max(0.0, self._written_at + PING_INTERVAL - time.monotonic())

    async def _stream(self, event: bytes, form: str) -> None:
        """``event`` on the stream, committed first; one writer at a time, none after the
        call has ended (its answer is written then, under the same lock)."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._done:
                return
            if not self.streaming:
                http_answers.add(1, {"form": form, "mcp.era": "modern"})
                await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                self.streaming = True
            await self._send({"type": "http.response.body", "body": event, "more_body": True})
            self._written_at = time.monotonic()

    async def _reply(self, request_id: RequestId, outcome: dict[str, Any] | ErrorData) -> None:
        """The answer, after whatever is being streamed (``_done`` is set: nothing follows it)."""
        if self._lock is None:  # nothing was ever streamed, nor is being
            await self._write(request_id, outcome)
            return
        async with self._lock:
            await self._write(request_id, outcome)

    async def _write(self, request_id: RequestId, outcome: dict[str, Any] | ErrorData) -> None:
        """The answer, as the SDK's entry writes it (its status for an error), encoded once."""
        if self.streaming:
            last = sdk._sse_event(_message(request_id, outcome))  # pyright: ignore[reportPrivateUsage]
            await self._send({"type": "http.response.body", "body": last, "more_body": False})
            return
        status = ERROR_CODE_HTTP_STATUS.get(outcome.code, 200) if isinstance(outcome, ErrorData) else 200
        http_answers.add(1, {"form": "json", "mcp.era": "modern"})
        await json_answer(self._send, json_body(request_id, outcome), status)


async def _served(
    runner: ServerRunner[Any], context: ExchangeContext, message: JSONRPCRequest
) -> dict[str, Any]:
    """What the SDK's ``serve_one`` does, but the connection's exit stack is unwound (shielded,
    bounded) only when something was pushed on it: for nearly every request nothing was, and
    the shielded scope cost 1 % of a call."""
    try:
        return await runner.on_request(context, message.method, message.params)
    finally:
        if holds_callbacks(runner.connection.exit_stack):
            await aclose_shielded(runner.connection)


class _NotAcceptable(Exception):
    """A POST whose ``Accept`` leaves out what its answer may be: answered 406 with the
    JSON-RPC error a handshake-era client gets, where the SDK's modern entry sends no body."""

    def __init__(self, json_response: bool) -> None:
        wanted = "application/json" if json_response else "both application/json and text/event-stream"
        error = {"code": INVALID_REQUEST, "message": f"Not Acceptable: Client must accept {wanted}"}
        self.body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
        super().__init__(error["message"])


def _message(request_id: RequestId, outcome: dict[str, Any] | ErrorData) -> JSONRPCResponse | JSONRPCError:
    if isinstance(outcome, ErrorData):
        return JSONRPCError(jsonrpc="2.0", id=request_id, error=outcome)
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=outcome)


@dataclass
class ExchangeContext(sdk._SingleExchangeDispatchContext):  # pyright: ignore[reportPrivateUsage]
    """The SDK's per-request context of its modern entry, sending the call's messages
    through its ``Exchange`` (the SDK's is a memory stream to its second task)."""

    exchange: Exchange | None = field(default=None, kw_only=True)

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        if self.exchange is None:
            return
        notification = JSONRPCNotification(
            jsonrpc="2.0", method=method, params=dict(params) if params is not None else None
        )
        await self.exchange.notify(sdk._sse_event(notification))  # pyright: ignore[reportPrivateUsage]
