"""How a modern-era ``POST`` is answered: in the request's own task, its reply written straight.

The SDK's modern entry (``handle_modern_request``) runs every request's handler in a task
group of its own with a second task watching for the client's disconnect, passes what the
handler sends through a memory stream, and writes the reply as a pydantic model through a
Starlette response: an eighth of the gateway's CPU per forwarded call (``bench/README.md``).
This serves the same request the same way with less: the same checks (the SDK's own
functions, in its order), the same runner (``serve_one``, so every middleware, validation and
``requestState`` seal applies), the same choice of answer (one JSON body when the call sends
nothing first, else ``text/event-stream`` with the SDK's frames and keepalive), and the same
cancellation (the client's disconnect cancels the call). The handler runs in the request's
task; one watcher task waits for the disconnect and, past ``PING_INTERVAL`` of silence,
commits the stream and pings it. Anything that is not a plain request the checks pass (a
notification, a batch, a malformed envelope or header, ``subscriptions/listen``) is handed
to the SDK's entry, which answers it and its errors as it always has.

It lives in ``compat/`` because it calls the SDK's private entry and helpers
(``tests/test_compat.py`` checks each).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import anyio
import msgspec
from mcp.server import _streamable_http_modern as sdk  # pyright: ignore[reportPrivateUsage]
from mcp.server.connection import Connection
from mcp.server.lowlevel import Server
from mcp.server.runner import modern_error_data, serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse, RequestId
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from agent_gateway.limits import replay
from agent_gateway.telemetry import http_answers

logger = logging.getLogger(__name__)

PING_INTERVAL: float = sdk._SSE_PING_INTERVAL  # pyright: ignore[reportPrivateUsage]
"""Seconds of silence before a call's answer becomes a stream, and between its keepalives."""
_SSE_HEADERS: list[tuple[bytes, bytes]] = sdk._SSE_HEADERS  # pyright: ignore[reportPrivateUsage]
_PING = b": ping\r\n\r\n"
_JSON_HEADERS = [(b"content-type", b"application/json")]
_encode = msgspec.json.Encoder().encode


class ModernEntry:
    """A session manager's modern-era requests, served as the SDK's entry serves them."""

    def __init__(
        self, app: Server[Any], settings: TransportSecuritySettings | None, json_response: bool
    ) -> None:
        self._app = app
        self._settings = settings
        self._security = TransportSecurityMiddleware(settings)
        self._json_response = json_response

    async def __call__(self, lifespan_state: Any, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        body = await request.body() if scope["method"] == "POST" else b""
        admitted = await self._admitted(request, body, lifespan_state)
        if admitted is None:  # the SDK's entry answers it, its errors included
            await sdk.handle_modern_request(
                self._app,
                self._settings,
                self._json_response,
                lifespan_state,
                scope,
                replay(body, receive),
                send,
            )
            return
        message, route = admitted
        connection = Connection.from_envelope(
            route.protocol_version, route.client_info, route.client_capabilities
        )
        exchange = _Exchange(
            request, message.id, progress_token_from_params(message.params), send, self._json_response
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch, exchange, receive, tg.cancel_scope)
            reply = await _answered(
                message.id,
                serve_one(
                    self._app,
                    exchange,
                    message.method,
                    message.params,
                    connection=connection,
                    lifespan_state=lifespan_state,
                ),
            )
            await exchange.finish(reply)
            tg.cancel_scope.cancel()

    async def _admitted(
        self, request: Request, body: bytes, lifespan_state: Any
    ) -> tuple[JSONRPCRequest, InboundModernRoute] | None:
        """The request in ``body`` and its route when every check of the SDK's entry passes;
        None for anything its entry would answer otherwise."""
        if (
            request.method != "POST"
            or await self._security.validate_request(request, is_post=True) is not None
        ):
            return None
        has_json, has_sse = check_accept_headers(request)
        if not has_json or not (self._json_response or has_sse):
            return None
        try:
            decoded = json.loads(body)
            message = JSONRPCRequest.model_validate(decoded) if "id" in decoded else None
        except (ValueError, RecursionError, TypeError, ValidationError):
            return None
        if message is None or message.method == "subscriptions/listen":
            return None
        if find_duplicated_routing_header(request.headers.items()) is not None:
            return None
        route = classify_inbound_request(decoded, headers=dict(request.headers))
        if not isinstance(route, InboundModernRoute):
            return None
        rejection = await sdk._mcp_param_rejection(self._app, request, message, route, lifespan_state)  # pyright: ignore[reportPrivateUsage]
        return (message, route) if rejection is None else None


class _Exchange:
    """The SDK's per-request ``DispatchContext`` for one POST, writing to its response itself:
    notifications commit ``text/event-stream`` (in JSON-response mode they are dropped, as
    the SDK drops them), and the reply goes out as one JSON body if nothing went before it."""

    can_send_request = False

    def __init__(
        self, request: Request, request_id: RequestId, progress_token: Any, send: Send, json_response: bool
    ) -> None:
        self.transport = TransportContext(
            kind="streamable-http", can_send_request=False, headers=request.headers
        )
        self.request_id = request_id
        self.message_metadata = ServerMessageMetadata(request_context=request)
        self.progress_token = progress_token
        self.cancel_requested = anyio.Event()
        self._send = send
        self._json_response = json_response
        self._lock = anyio.Lock()
        self._streaming = False

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        if self._json_response:
            return
        event = sdk._sse_event(  # pyright: ignore[reportPrivateUsage]
            JSONRPCNotification(
                jsonrpc="2.0", method=method, params=dict(params) if params is not None else None
            )
        )
        try:
            await self._stream(event)
        except OSError:  # the client has gone: its call is being cancelled
            logger.debug("dropped %s: response stream closed", method)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)

    async def ping(self) -> None:
        """Keep a silent call's connection open past a proxy's idle-read timeout."""
        if not self._json_response:
            await self._stream(_PING)

    async def finish(self, reply: JSONRPCResponse | JSONRPCError) -> None:
        async with self._lock:
            if self._streaming:
                await self._send(
                    {"type": "http.response.body", "body": sdk._sse_event(reply), "more_body": False}
                )  # pyright: ignore[reportPrivateUsage]
                return
            http_answers.add(1, {"form": "json", "mcp.era": "modern"})
            await _json_reply(reply, self._send)

    async def _stream(self, event: bytes) -> None:
        async with self._lock:
            if not self._streaming:
                self._streaming = True
                http_answers.add(1, {"form": "stream", "mcp.era": "modern"})
                await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await self._send({"type": "http.response.body", "body": event, "more_body": True})


async def _watch(exchange: _Exchange, receive: Receive, call: anyio.CancelScope) -> None:
    """Cancel ``call`` when the client disconnects (how the modern era cancels); ping it
    after each ``PING_INTERVAL`` of silence."""
    while True:
        with anyio.move_on_after(PING_INTERVAL):
            while (await receive())["type"] != "http.disconnect":
                pass
            call.cancel()
            return
        await exchange.ping()


async def _answered(request_id: RequestId, result: Any) -> JSONRPCResponse | JSONRPCError:
    """The SDK's boundary: the handler's outcome as the JSON-RPC reply (anything not mapped
    is a generic internal error, so a handler's internals never reach the wire)."""
    try:
        return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=await result)
    except Exception as exc:
        return JSONRPCError(jsonrpc="2.0", id=request_id, error=modern_error_data(exc))


async def _json_reply(reply: JSONRPCResponse | JSONRPCError, send: Send) -> None:
    """``reply`` as the SDK's ``_write`` makes it (the table-mapped status), encoded once."""
    status = ERROR_CODE_HTTP_STATUS.get(reply.error.code, 200) if isinstance(reply, JSONRPCError) else 200
    body = _encode(reply.model_dump(mode="json", by_alias=True, exclude_none=True))
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
