"""A ``tools/call`` forwarded to a modern-era Streamable HTTP upstream as its own JSON-RPC,
below the SDK's client.

The SDK's client sends a request through its session, its dispatcher's pending table and
streams, a writer task per POST and httpx2's request building: a third of the gateway's CPU
per forwarded call (``bench/README.md``). When the upstream speaks the modern era (no
session, one POST per request) none of that machinery is needed: this sends the request the
SDK's session would send (its ``_meta`` and headers stamped by the session itself,
``compat/mcp.stamp``) straight on the transport's aiohttp connections (with the HTTP client's
headers, cookies, timeouts and trace-context hook as httpx2 would apply them, and its body
bound), and reads the answer as the SDK's transport would:

- a JSON body, or an SSE stream whose progress notifications go to the caller's progress
  relay and whose other notifications go where the session sends them: log lines to its
  logging callback (so to the caller, ``Replies.on_log``) and every one to its message
  handler (a tool list changed during the call refreshes the catalog);
- an HTTP error as the SDK reports it (the JSON-RPC error in the body, else 404 as
  method-not-found, else an internal error), JSON-RPC errors as ``MCPError``;
- the result checked as the SDK checks it (the result's schema, then the tool's output
  schema: quickly by ``schema_check``, else through the session's own ``validate_tool_result``).

The upstream's input requests (``InputRequiredResult``) go back to a modern-era caller as
they are; for a handshake-era one they are answered through the client's callbacks and the
call sent again, as the SDK's ``Client.call_tool`` does (``compat/mcp.call_in_rounds``).
Cancelling the call closes the POST, which is how the modern era cancels. The CLIENT span is
the SDK's own (its tracer, name and attributes), so ``telemetry.UpstreamSpans`` enriches it
as any other, and its context goes out in ``_meta`` and the headers alike.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types as types
import msgspec
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import methods as mcp_methods
from opentelemetry.trace import INVALID_SPAN
from pydantic import TypeAdapter, ValidationError

from agent_gateway.compat.http_streams import (
    NOISE,
    StreamNoise,
    cut_short,
    message_made,
    names_its_method_first,
    quiet_events,
)
from agent_gateway.compat.mcp import (
    Unreadable,
    bounded,
    call_in_rounds,
    count_values,
    decode,
    inject_trace_context,
    otel_client_span,
    output_schemas,
    stamp,
)
from agent_gateway.errors import error_type_of
from agent_gateway.schema_check import SchemaCheck
from agent_gateway.trace_context import carried, tracing
from agent_gateway.upstreams.client_side import ClientSide
from agent_gateway.upstreams.http_client import UpstreamClient
from agent_gateway.upstreams.pace import Pace

logger = logging.getLogger(__name__)

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
OnLog = Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]
Sinks = tuple[OnLog, Callable[[Any], Awaitable[None]]]
"""Where the session sends an upstream's notifications: its logging callback, its message handler."""

_DROPPED = "upstream session %s: a notification on a forwarded call's stream dropped: %s"
_ids = itertools.count(1)
_encode = msgspec.json.Encoder().encode
_ACCEPT = "application/json, text/event-stream"
_INPUT_RESPONSES = TypeAdapter(types.InputResponses)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One ``tools/call`` to forward: on ``client``'s session (whose stamp and checks it gets),
    with the caller's ``_meta`` and progress relay."""

    client: Client
    name: str
    arguments: dict[str, Any]
    meta: dict[str, Any] | None = None
    progress: Progress | None = None


class OutputChecks:
    """Each tool's output schema, compiled for the quick check (``schema_check``): a result it
    passes needs no more; any other is judged by the session's own ``validate_tool_result``,
    which words (and raises) the errors callers have always seen. The SDK's check is
    jsonschema's, pure Python: about a fortieth of a forwarded call's CPU."""

    def __init__(self) -> None:
        self._checks: dict[str, tuple[dict[str, Any], SchemaCheck | None]] = {}

    def hold(self, session: Any, name: str, answer: types.CallToolResult) -> bool:
        """Whether ``answer`` of tool ``name`` surely passes the session's check."""
        schemas = output_schemas(session)
        if name not in schemas:  # not listed (or no longer): the session lists its tools again to check
            self._checks.pop(name, None)
            return False
        schema = schemas[name]
        if schema is None:
            return True
        if answer.structured_content is None:
            return False
        known = self._checks.get(name)
        if known is None or known[0] is not schema:  # the tool's schema changed since
            known = self._checks[name] = (schema, SchemaCheck(schema) if _read_alike(schema) else None)
        return known[1] is not None and known[1].holds(answer.structured_content)


_READ_APART = frozenset({"pattern", "patternProperties", "multipleOf"})
"""Keywords jsonschema-rs reads more leniently than jsonschema (ECMA-262 classes such as
``\\D`` against Python's Unicode ones; fractional ``multipleOf``). An argument checked
quickly is judged again by its upstream; a result is not, so a schema with them is the SDK's."""


def _read_alike(schema: Any) -> bool:
    """Whether no keyword of ``schema`` (at any depth) is one the two validators read apart
    (False too for a schema nested too deep to walk)."""
    try:
        return _no_keyword_apart(schema)
    except RecursionError:
        return False


def _no_keyword_apart(schema: Any) -> bool:
    if isinstance(schema, dict):
        return _READ_APART.isdisjoint(schema) and all(_no_keyword_apart(v) for v in schema.values())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(schema, list):
        return all(_no_keyword_apart(v) for v in schema)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return True


class Forwarder:
    """Sends ``tools/call`` requests to one modern-era Streamable HTTP upstream."""

    def __init__(
        self, http: httpx2.AsyncClient, url: str, max_event_bytes: int, sinks: Sinks, pace: Pace
    ) -> None:
        """``http``: the transport's client; on an ``UpstreamClient`` a call is posted straight
        on its aiohttp connections (httpx2's request and response building are a tenth of a
        forwarded call's CPU), on any other (or to a URL with credentials) through the client."""
        self._http = http
        self._url = url
        self._max_event = max_event_bytes
        self._sinks = sinks
        self._pace = pace
        """Shared with the session: the notifications on every call's stream count together."""
        wire = http.wire if isinstance(http, UpstreamClient) else None
        # Credentials in the URL become an Authorization header only in httpx2's own building.
        direct = wire is not None and not httpx2.URL(url).userinfo
        self._direct = (wire, wire.target(url)) if direct and wire is not None else None
        self._outputs = OutputChecks()

    async def forward(
        self, call: ToolCall, passing: ClientSide | None
    ) -> types.CallToolResult | types.InputRequiredResult:
        """``call`` made for a caller. ``passing``: a modern-era caller, to whom the
        upstream's input requests (``InputRequiredResult``) go back as they are, with its
        answers to the last round sent on; without one they are answered here, through the
        client's callbacks (so the caller's relays), and the call sent again, as the SDK's
        ``Client.call_tool`` does (``compat/mcp.call_in_rounds``)."""
        if passing is not None:
            return await self.call_tool(call, passing.input_responses, passing.request_state)

        async def send(answers: types.InputResponses | None, state: str | None) -> Any:
            return await self.call_tool(call, answers, state)

        return await call_in_rounds(call.client, call.name, send)

    async def call_tool(
        self,
        call: ToolCall,
        input_responses: types.InputResponses | None = None,
        request_state: str | None = None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """``call`` sent once, as the session would send it (with the answers to a previous
        round's input requests, and that round's state); the upstream's answer.

        Raises:
            MCPError, ValidationError, httpx2.TransportError (``UpstreamSession`` translates them).
        """
        client, name, progress = call.client, call.name, call.progress
        request_id = next(_ids)
        body = _params(call, input_responses, request_state)
        data: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": body}
        headers = {"accept": _ACCEPT, "content-type": "application/json", **stamp(client.session, data)}
        sent: dict[str, Any] = body["_meta"]  # the session's stamp is in it now
        if progress is not None:  # the upstream reports progress only when given a token
            sent["progressToken"] = request_id
        # Untraced, the span would be a no-op: its name and attributes go unmade.
        spanned = otel_client_span("tools/call", name, request_id) if tracing() else nullcontext(INVALID_SPAN)
        with spanned as span:
            inject_trace_context(sent)
            version = client.protocol_version or "2026-07-28"
            headers.update(carried(sent))  # as the transport's trace hook does
            message = await self._exchange(_encode(data), headers, request_id, version, progress)
            if "error" in message:
                error = types.ErrorData.model_validate(message["error"], by_name=False)
                span.set_attributes(
                    {"error.type": error_type_of(error.code), "rpc.response.status_code": str(error.code)}
                )
                raise MCPError.from_error_data(error)
        result = message.get("result")
        if not isinstance(result, dict):
            raise MCPError(code=types.INTERNAL_ERROR, message="the answer holds no result")
        if result.get("resultType") == "input_required":
            return types.InputRequiredResult.model_validate(result, by_name=False)
        bounded("tools/call", result)  # as the SDK's client's check does (``compat/mcp``)
        answer = types.CallToolResult.model_validate(result, by_name=False)
        if not answer.is_error and not self._outputs.hold(client.session, name, answer):
            await client.session.validate_tool_result(name, answer)
        return answer

    async def _exchange(
        self,
        content: bytes,
        headers: dict[str, str],
        request_id: int,
        version: str,
        progress: Progress | None,
    ) -> dict[str, Any]:
        if self._direct is None or self._http.cookies:  # the jar is httpx2's to send
            async with self._http.stream("POST", self._url, content=content, headers=headers) as response:
                return await self._answer(response, response.aread, request_id, version, progress)
        wire, target = self._direct
        async with wire.post(target, content, self._merged(headers), self._http.timeout) as posted:
            if posted.status == 200 and posted.content_type == "application/json" and not posted.sets_cookie:
                return await _parsed(posted.read)  # the common answer: no httpx2 response made
            response = posted.as_httpx2()
            self._http.cookies.extract_cookies(response)
            return await self._answer(response, posted.read, request_id, version, progress)

    def _merged(self, headers: dict[str, str]) -> dict[str, str]:
        """The client's headers (``Accept-Encoding: identity`` among them: nothing here decodes
        an answer) under the request's own, as httpx2 merges them."""
        merged = {k.lower(): v for k, v in self._http.headers.items()}
        return merged | {k.lower(): v for k, v in headers.items()}

    async def _answer(
        self,
        response: httpx2.Response,
        read: Callable[[], Awaitable[bytes]],
        request_id: int,
        version: str,
        progress: Progress | None,
    ) -> dict[str, Any]:
        """The JSON-RPC answer ``response`` holds (``read``: its whole body), as the SDK's
        transport reads it."""
        status = response.status_code
        if status >= 300 or status == 202:  # refused, redirected (not followed), or no answer
            raise await _refusal(response)
        kind = response.headers.get("content-type", "").lower()
        if kind.startswith("application/json"):
            return await _parsed(read)
        if kind.startswith("text/event-stream"):
            return await self._streamed(response, request_id, version, progress)
        raise MCPError(code=types.INVALID_REQUEST, message=f"Unexpected content type: {kind}")

    async def _streamed(
        self,
        response: httpx2.Response,
        request_id: int,
        version: str,
        progress: Progress | None,
    ) -> dict[str, Any]:
        """The response an SSE stream ends with; what comes before it relayed."""
        try:
            async for event in quiet_events(response, self._max_event):
                if event.event != "message" or not event.data:
                    continue  # a priming event (an id only): nothing to resume in this era
                try:
                    message = _message(event.data, "SSE message")
                except MCPError as exc:
                    if not names_its_method_first(event.data):  # maybe the answer: the call fails
                        raise
                    await self._pace.take_report()
                    label = self._pace.label
                    logger.warning(_DROPPED, label, exc.error.message, extra={"peer": label})
                    continue
                message_made()
                if message.get("id") == request_id and ("result" in message or "error" in message):
                    return message
                await self._pace.take_report()
                await _relay(message, version, progress, self._sinks)
        except httpx2.SSEError as exc:
            raise MCPError.from_error_data(cut_short(f"SSE stream failed: {exc}")) from exc
        except StreamNoise:  # comments without end: the call would wait its timeout, parsing them
            raise MCPError.from_error_data(cut_short(NOISE)) from None
        except httpx2.StreamError as exc:  # as the SDK's transport: the stream is over
            logger.debug("SSE stream of a forwarded call ended: %s", exc)
        raise MCPError.from_error_data(cut_short("SSE stream ended without a response"))


def _params(
    call: ToolCall, input_responses: types.InputResponses | None, request_state: str | None
) -> dict[str, Any]:
    """The request's params as JSON, built directly (the arguments were validated already)."""
    params: dict[str, Any] = {"name": call.name, "arguments": call.arguments, "_meta": dict(call.meta or {})}
    if input_responses is not None:
        params["inputResponses"] = _INPUT_RESPONSES.dump_python(
            input_responses, by_alias=True, mode="json", exclude_none=True
        )
    if request_state is not None:
        params["requestState"] = request_state
    return params


async def _relay(message: dict[str, Any], version: str, progress: Progress | None, sinks: Sinks) -> None:
    """A message the upstream sent on the call's stream before its answer, where the SDK's
    session would send it: progress to the call's relay, notifications to the logging
    callback and the message handler (a tool list changed during the call, say)."""
    method = message.get("method")
    if not isinstance(method, str) or "id" in message:  # the modern era asks by InputRequiredResult
        raise MCPError(
            code=types.INVALID_REQUEST, message=f"sent a request ({method}) inside a modern-era call"
        )
    params = message.get("params")
    if method == "notifications/progress":
        try:
            update = types.ProgressNotificationParams.model_validate(params, by_name=False)
        except ValidationError:  # the SDK drops a malformed notification too, not the call
            logger.warning("malformed progress notification on a forwarded call's stream: dropped")
            return
        if progress is not None:
            await progress(update.progress, update.total, update.message)
        return
    try:
        notification = mcp_methods.parse_server_notification(method, version, params)
    except (KeyError, ValidationError):
        logger.debug(
            "notification %s on a forwarded call's stream: not one of %s's, dropped", method, version
        )
        return
    if isinstance(notification, types.CancelledNotification):
        return  # the SDK never surfaces these either
    on_log, on_message = sinks
    if isinstance(notification, types.LoggingMessageNotification):
        await on_log(notification.params)
    await on_message(notification)


async def _parsed(read: Callable[[], Awaitable[bytes]]) -> dict[str, Any]:
    """The JSON body ``read`` gives, as one JSON-RPC message."""
    try:  # a body over a bound (in_flight, max_message_bytes) is a StreamError
        return _message(await read(), "JSON response")
    except httpx2.StreamError as exc:
        raise MCPError(code=types.PARSE_ERROR, message=f"Failed to parse JSON response: {exc}") from exc


def _message(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        count_values(raw)  # as parse_message does
        message = decode(raw)
    except Unreadable as exc:
        raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise MCPError(code=types.PARSE_ERROR, message=f"Failed to parse {what}: {exc}") from exc
    if not isinstance(message, dict):
        raise MCPError(code=types.PARSE_ERROR, message=f"Failed to parse {what}: not a JSON-RPC message")
    return message  # pyright: ignore[reportUnknownVariableType]


async def _refusal(response: httpx2.Response) -> MCPError:
    """What the SDK's transport makes of an HTTP refusal: the JSON-RPC error in the body if
    there is one, else 404 as method-not-found (no session in this era), else an internal error."""
    status = response.status_code
    if status >= 400 and response.headers.get("content-type", "").lower().startswith("application/json"):
        try:
            error = _message(await response.aread(), "JSON response").get("error")
            return MCPError.from_error_data(types.ErrorData.model_validate(error, by_name=False))
        except (MCPError, ValidationError, httpx2.StreamError):
            pass
    if status == 404:
        return MCPError(code=types.METHOD_NOT_FOUND, message="Not Found")
    if status == 202:
        return MCPError(code=types.INVALID_REQUEST, message="server answered a request with 202 Accepted")
    if status < 400:
        return MCPError(code=types.INVALID_REQUEST, message=f"redirected ({status}): not followed")
    return MCPError(code=types.INTERNAL_ERROR, message="Server returned an error response")
