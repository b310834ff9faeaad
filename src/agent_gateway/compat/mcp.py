"""The ``mcp`` SDK's internals the gateway uses (verified against mcp 2.3.0)."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anyio
import msgspec
from mcp import Client
from mcp.client import session as client_session
from mcp.client import streamable_http
from mcp.client._transport import TransportStreams
from mcp.server.connection import Connection
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, create_mcp_http_client
from mcp.shared._otel import inject_trace_context, otel_span
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    CallToolResult,
    InputRequiredResult,
    InputResponses,
    JSONRPCMessage,
    jsonrpc_message_adapter,
)
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry.trace import Span, SpanKind
from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, from_json

from agent_gateway.catalog_parts import MAX_LISTED
from agent_gateway.json_text import answers, json_values, nests_deeper, opens_past, value_nests_deeper

__all__ = [
    "CLIENT_SESSION_LOGGER",
    "MAX_MESSAGE_VALUES",
    "MCP_DEFAULT_SSE_READ_TIMEOUT",
    "MCP_DEFAULT_TIMEOUT",
    "ReadStream",
    "Round",
    "TooManyValues",
    "TransportStreams",
    "Unreadable",
    "WriteStream",
    "call_in_rounds",
    "connection_of",
    "count_values",
    "create_mcp_http_client",
    "decode",
    "inject_trace_context",
    "lean_client_parsing",
    "lean_result_checks",
    "otel_client_span",
    "output_schemas",
    "parse_message",
    "result_check_failed",
    "stamp",
]

CLIENT_SESSION_LOGGER: str = client_session.logger.name
"""The logger of the SDK's client session (named ``client``, not its module's name): where
it warns of an upstream's malformed notifications."""


def connection_of(session: Any) -> Connection:
    """The ``Connection`` behind a ``ServerSession`` (its per-connection ``state`` and
    notification senders), which the SDK keeps private."""
    connection: Connection = session._connection  # pyright: ignore[reportPrivateUsage]
    return connection


def output_schemas(session: Any) -> Mapping[str, dict[str, Any] | None]:
    """The output schema of each tool a ``ClientSession`` has listed, by the upstream's name
    (None: the tool has none), as its ``validate_tool_result`` reads them."""
    schemas: Mapping[str, dict[str, Any] | None] = session._tool_output_schemas  # pyright: ignore[reportPrivateUsage]
    return schemas


MAX_MESSAGE_VALUES = 1_000_000
"""The JSON values one message from an upstream may hold. The parse makes an object of each
(all of it on the event loop): a page of a million tiny tools (56 MB, three million values)
stalled every client 3.2 s and took 1.8 GB at each retry; 128 MiB of ``{}`` would be 42
million. A listing of the most tools the gateway takes from one upstream (10,000) holds
about 550,000 (55 a tool in the tool search benchmark's 2,815). Below the bound a message
of small containers still costs its parse (``decode`` pauses the collector for it)."""


class Unreadable(ValueError):
    """A message from an upstream the gateway does not read: answered to the request it
    answers where the transport can tell which, as an oversized one is."""


class TooManyValues(Unreadable):
    """A message from an upstream holding more than ``MAX_MESSAGE_VALUES`` JSON values, found
    by counting its punctuation before it is parsed (``json_text.json_values``)."""

    @classmethod
    def holding(cls, values: int) -> TooManyValues:
        return cls(
            f"the upstream's message holds {values:,} JSON values or more; "
            f"the gateway reads at most {MAX_MESSAGE_VALUES:,} from one message"
        )


def count_values(data: bytes | str) -> None:
    """Raises ``TooManyValues`` when ``data`` holds more than ``MAX_MESSAGE_VALUES`` values."""
    if (values := json_values(data, MAX_MESSAGE_VALUES)) > MAX_MESSAGE_VALUES:
        raise TooManyValues.holding(values)


def parse_message(data: bytes | str) -> JSONRPCMessage:
    """One JSON-RPC message, as ``jsonrpc_message_adapter.validate_json`` reads it, in a
    quarter of the memory. pydantic's own JSON parser holds three to four times a message's
    size at its peak (an 80 MB answer: +320 MB); msgspec makes the Python objects straight
    from the bytes (+80 MB), and pydantic validates them keeping their strings. What msgspec
    refuses (bad JSON, bad UTF-8) is left to pydantic, which raises its own error for it.

    Raises:
        TooManyValues: it holds more than ``MAX_MESSAGE_VALUES`` values (it is not parsed).
        Unreadable: it nests too deeply, holds numbers JSON lacks, or answers in the wrong shape.
        ValidationError: it is not a JSON-RPC message.
    """
    count_values(data)
    try:
        decoded = decode(data)
    except Unreadable:
        raise
    except ValueError:  # msgspec's DecodeError, or bad UTF-8 (UnicodeDecodeError)
        return jsonrpc_message_adapter.validate_json(data, by_name=False)
    try:
        return jsonrpc_message_adapter.validate_python(decoded, by_name=False)
    except ValidationError as exc:  # an answer's: its call fails now, not at its timeout (-32001)
        if answers(decoded):
            raise Unreadable(_MISSHAPEN) from exc
        raise


_MISSHAPEN = "the upstream's answer is not a JSON-RPC response: its result or error has the wrong shape"


_decode = msgspec.json.Decoder().decode
_LARGE = 2**20
"""A message past this many bytes is decoded with the garbage collector paused."""
MAX_MESSAGE_DEPTH = 200
"""How deep one message from an upstream may nest. Past about 255 levels the SDK's models
fail to write the answer to the client (a -32603 for the call and an ERROR traceback logged,
each time); msgspec stops near 1,000 (a ``RecursionError``)."""
_TOO_DEEP = f"the upstream's message nests deeper than the gateway reads ({MAX_MESSAGE_DEPTH} levels)"


def decode(data: bytes | str) -> Any:
    """``data``'s JSON value, by msgspec. A large message is decoded with the collector
    paused: it ran again and again over the objects being made (a 3 MB answer of 330,000
    ``{"a": {}}``: 327 ms, 50 ms paused; 700 ms in a gateway's larger heap).

    Raises:
        Unreadable: it nests deeper than ``MAX_MESSAGE_DEPTH`` (``_nests_deeper``), a tool
            listing excepted, or than msgspec reads (a ``RecursionError``, which ended a
            stdio upstream's reader and its session).
        msgspec.DecodeError, UnicodeDecodeError: it is not JSON (``Unreadable`` when it holds
            NaN, Infinity or a number past a double's range).
    """
    paused = len(data) > _LARGE and gc.isenabled()
    if paused:
        gc.disable()
    try:
        value = _decode(data)
    except RecursionError:
        raise Unreadable(_TOO_DEEP) from None
    except msgspec.DecodeError as exc:
        if _read_leniently(data, exc):
            raise Unreadable(_NOT_JSON_NUMBERS) from None
        raise
    finally:
        if paused:
            gc.enable()
    if _nests_deeper(data, value) and not _lists_tools(value):
        raise Unreadable(_TOO_DEEP)
    return value


_WALKED = 4096
"""Values of a message walked for its depth before its bytes are read for it instead."""


def _nests_deeper(data: bytes | str, value: Any) -> bool:
    """Whether the message ``data`` (parsed: ``value``) nests deeper than ``MAX_MESSAGE_DEPTH``.
    A small message's brackets are counted first (most hold too few to nest that deep), a
    large one's values walked (a step each: next to nothing for an answer of text, where the
    counts cost 0.5 ms a MB), and past ``_WALKED`` values its bytes read (``nests_deeper``:
    counts, then a few passes over the bytes, cheaper than a walk of many small values)."""
    if len(data) <= _LARGE and not opens_past(data, MAX_MESSAGE_DEPTH):
        return False
    walked = value_nests_deeper(value, MAX_MESSAGE_DEPTH, _WALKED)
    return nests_deeper(data, MAX_MESSAGE_DEPTH) if walked is None else walked


_NOT_JSON_NUMBERS = (
    "the upstream's message holds NaN, Infinity or a number past a double's range, which JSON does not have"
)


def _read_leniently(data: bytes | str, refusal: msgspec.DecodeError) -> bool:
    """Whether pydantic's parser reads ``data``, which msgspec refused for a number it has no
    value for (out of range) or a character it does not read (NaN and Infinity start with
    one): then it holds such a number (the one difference). Read by pydantic (the SDK's
    parser), each reached the client as null: a value the upstream never sent. Asked only
    then: any other message msgspec refuses would be parsed twice (1.2 s for 38 MB)."""
    named = (
        (b"NaN" in data or b"Infinity" in data)
        if isinstance(data, bytes)
        else ("NaN" in data or "Infinity" in data)
    )
    if not (named or isinstance(refusal, msgspec.ValidationError)):
        return False
    try:
        from_json(data)
    except ValueError:
        return False
    return True


_LISTING_KEYS = frozenset(("tools", "nextCursor", "_meta"))


def _lists_tools(value: Any) -> bool:
    """Whether ``value`` answers a ``tools/list``: read however deep it nests (within what
    msgspec reads), since each tool whose schema is too deep for a client is left out alone
    (``catalog_parts``), not its upstream's whole list. Known by its keys: a result of
    another kind holding ``tools`` too is no listing."""
    result = value.get("result") if isinstance(value, dict) else None
    if not isinstance(result, dict):
        return False
    return isinstance(result.get("tools"), list) and result.keys() <= _LISTING_KEYS  # pyright: ignore[reportUnknownMemberType]


class _LeanAdapter:
    """``jsonrpc_message_adapter`` as the SDK's Streamable HTTP client calls it."""

    def validate_json(self, data: bytes | str, *, by_name: bool = False) -> JSONRPCMessage:
        """``parse_message``, its refusals raised as pydantic's errors are: the SDK answers
        the request a JSON body answers with its parse error for those alone."""
        assert not by_name, "the SDK reads messages by alias"
        try:
            return parse_message(data)
        except Unreadable as exc:
            reason = PydanticCustomError("unreadable", "{reason}", {"reason": str(exc)})
            detail = InitErrorDetails(type=reason, input=None)
            raise ValidationError.from_exception_data("JSONRPCMessage", [detail]) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(jsonrpc_message_adapter, name)


RESULT_CHECKS = (
    "has an output schema but did not return structured content",
    "Invalid structured content returned by tool",
    "Invalid schema for tool",
)
"""How ``ClientSession.validate_tool_result`` words its verdicts (``tests/test_compat.py``)."""


def result_check_failed(exc: RuntimeError) -> bool:
    """Whether ``exc`` is the SDK client's verdict that a tool's result does not match its
    output schema: ``validate_tool_result`` raises a bare ``RuntimeError`` for it."""
    text = str(exc)
    return any(words in text for words in RESULT_CHECKS)


def lean_client_parsing() -> None:
    """Make the SDK's Streamable HTTP client (the gateway's, to its upstreams) parse every
    answer and event with ``parse_message``. The client reads the module's
    ``jsonrpc_message_adapter`` at each message (``tests/test_compat.py`` checks); the SDK
    has no parser to pass. Idempotent."""
    streamable_http.jsonrpc_message_adapter = _LeanAdapter()  # type: ignore[assignment]


def lean_result_checks() -> None:
    """Make the SDK's client check each upstream result against the negotiated version's
    schema without dumping it again.

    ``ClientSession.send_request`` calls ``mcp_types.methods.validate_server_result``, which
    validates the result and then dumps the model it built, only to discard the dump (a
    10,000-tool catalog: ~0.7 s of a gateway's start-up; every call pays it too); its
    twin ``validate_client_result`` only validates. This makes the first like the second:
    same checks, same errors. The client reads the function from the module at each request
    (``tests/test_compat.py`` checks). Idempotent."""
    _methods.validate_server_result = _validate_server_result


class PageTooLong(ValueError):
    """A page of a list holding more items than the gateway takes from one upstream in all
    (``catalog_parts.MAX_LISTED``): refused before its items are made models (a page of a
    million tiny tools, 50 MB, took 20 s of the event loop and 2.8 GB to validate)."""


_LISTED = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}

_ANSWERED = {
    "prompts/get": ("messages", 1_000),
    "resources/read": ("contents", 10_000),
    "tools/call": ("content", 10_000),
}
"""A rendered prompt's messages, a read's contents, a tool result's blocks: how many the gateway
takes from one answer (a model is Python, ~30-80 µs an item: 100,000 messages held the event
loop 8 s a render, a result of 100,000 blocks 3.9 s)."""
MAX_COMPLETION_VALUES = 100
"""A completion's values, as MCP bounds them ("must not exceed 100 items")."""


def bounded(method: str, data: Mapping[str, Any]) -> None:
    """``PageTooLong`` for an answer of more items than ``_ANSWERED`` takes, before they are models."""
    key, most = _ANSWERED.get(method, ("", 0))
    if isinstance(items := data.get(key), list) and len(items) > most:  # pyright: ignore[reportUnknownArgumentType]
        noun = "content blocks" if key == "content" else key
        raise PageTooLong(f"its answer holds {len(items):,} {noun}; the gateway takes {most:,}")  # pyright: ignore[reportUnknownArgumentType]


def _validate_server_result(
    method: str,
    version: str,
    data: Mapping[str, Any],
    *,
    surface: Mapping[tuple[str, str], Any] = _methods.SERVER_RESULTS,
) -> None:
    items: object = data.get(_LISTED.get(method, ""))
    if isinstance(items, list) and len(items) > MAX_LISTED:  # pyright: ignore[reportUnknownArgumentType]
        raise PageTooLong(f"a page of {len(items):,} items")  # pyright: ignore[reportUnknownArgumentType]
    bounded(method, data)
    completion = data.get("completion") if method == "completion/complete" else None
    values = completion.get("values") if isinstance(completion, dict) else None
    if isinstance(values, list) and len(values) > MAX_COMPLETION_VALUES:  # pyright: ignore[reportUnknownArgumentType]
        del values[MAX_COMPLETION_VALUES:]  # the first 100, as the model is made of ``data`` next
        completion["hasMore"] = True  # pyright: ignore[reportIndexIssue, reportOptionalSubscript]
    _methods._check_known_version(version)  # pyright: ignore[reportPrivateUsage]
    _methods._adapter(surface[(method, version)]).validate_python(data, by_name=False)  # pyright: ignore[reportPrivateUsage]


def stamp(session: Any, data: dict[str, Any]) -> dict[str, str]:
    """What the SDK's ``ClientSession`` adds to request ``data`` before sending it, in the era
    it negotiated: the ``_meta`` entries (a modern request's protocol version, client info and
    capabilities, log level) set in ``data``, and the headers returned (protocol version,
    method, name, ``Mcp-Param-*`` from the tool's listing). Its private ``_stamp``: the one
    place both are made, so a request sent below the session is the one it would send."""
    options: dict[str, Any] = {}
    session._stamp(data, options)  # pyright: ignore[reportPrivateUsage]
    headers: dict[str, str] = options.get("headers", {})
    return headers


@contextmanager
def otel_client_span(method: str, name: str | None, request_id: int) -> Iterator[Span]:
    """The CLIENT span the SDK's dispatcher makes around a request it sends (its tracer, name
    and attributes), for a request sent below it."""
    span_name = f"MCP send {method}{f' {name}' if name is not None else ''}"
    attributes = {"mcp.method.name": method, "jsonrpc.request.id": str(request_id)}
    with otel_span(span_name, kind=SpanKind.CLIENT, attributes=attributes) as span:
        yield span


Round = Callable[[InputResponses | None, str | None], Awaitable[CallToolResult | InputRequiredResult]]
"""One ``tools/call`` sent with a round's input responses and request state; its answer."""


async def call_in_rounds(client: Client, name: str, send: Round) -> CallToolResult:
    """What ``Client.call_tool`` does around each ``tools/call`` it sends, around ``send``: an
    ``InputRequiredResult`` answered through the client's own callbacks and the call sent
    again (its private ``_drive_input_required``, up to its rounds bound), and, in the modern
    era, a ``HEADER_MISMATCH`` answered by listing the tool again (``_relist_tool``) and
    sending once more."""

    async def retry(
        answers: InputResponses | None, state: str | None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await send(answers, state)
        except MCPError as mismatch:
            if mismatch.code != HEADER_MISMATCH or client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                raise
            try:
                with anyio.fail_after(client.read_timeout_seconds):
                    await client._relist_tool(name)  # pyright: ignore[reportPrivateUsage]
            except (MCPError, TimeoutError, ValidationError, PageTooLong) as relist_error:
                raise mismatch from relist_error
            return await send(answers, state)

    result = await client._drive_input_required(await retry(None, None), retry)  # pyright: ignore[reportPrivateUsage]
    if not isinstance(result, CallToolResult):  # a claimed shape: the gateway's clients claim none
        raise MCPError(code=INTERNAL_ERROR, message=f"tool {name!r} answered with an unclaimed result shape")
    return result
