"""What is wrong with a line a stdio client wrote, and the JSON-RPC error it is answered with.

The SDK's stdio transport drops a line it cannot validate (not JSON, a batch, ``params`` not
an object, ``"jsonrpc": "1.0"``, nesting deeper than its parser reads) and reads a request
whose id is neither a string nor an integer as a notification: either way without a word,
and the client waits for an answer that never comes. Over HTTP each gets a JSON-RPC error.
So each line is checked here before the SDK reads it, and a bad one answered as JSON-RPC 2.0
says: ``-32700`` (Parse error) to a null id for a line that is not JSON, ``-32600`` (Invalid
Request) for anything else, to the request's id when it has a usable one (a string or an
integer), else to a null id. MCP uses no batches: a batch is refused whole, to the id of its
one request if it holds exactly one. An answer from the client (to a request of the
gateway's, such as sampling) that is malformed is not answered: an error to an answer would
be read as an answer to a request of the client's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from agent_gateway.json_text import json_values, nests_deeper, unrepresentable
from agent_gateway.logs import clipped
from agent_gateway.upstreams.stdio import request_id_of

TOO_DEEP = "the request is nested too deeply to read"
"""As an HTTP body nested too deeply is refused (``limits``)."""

_EDGE = 512
"""The first and last characters of a line too deep to parse where its id is looked for."""


@dataclass(frozen=True)
class Malformed:
    """Why a line is refused, and the error it is answered with (None: nothing to answer)."""

    reason: str
    answer: types.JSONRPCError | None


def malformed(line: str) -> Malformed | None:
    """What is wrong with ``line``; None when the SDK reads it as what it is."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        return _diagnosed(line, exc)
    if nests_deeper(line):  # as an HTTP body is refused (``limits``)
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return Malformed(TOO_DEEP, None)
        return refusal(TOO_DEEP, _usable(getattr(message, "id", None)))
    if (held := unrepresentable(line)) is not None:
        reason = f"the message holds {held}"
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return Malformed(reason, None)  # an answer: an error to it would be read as one
        return refusal(reason, _usable(getattr(message, "id", None)), types.PARSE_ERROR)
    if isinstance(message, types.JSONRPCNotification) and '"id"' in line:
        return _diagnosed(line, None)  # a request whose id the SDK did not take, maybe
    return None


def too_many_values(line: bytes, bound: int) -> Malformed | None:
    """Why ``line`` is refused unparsed: it holds more JSON values than ``bound``
    (``server.max_body_elements``, as an HTTP body; 1.3 million ``{}`` in a 3.9 MB line cost
    1.1 s of CPU and 140 MB to parse). Answered to its id when it is a request's (its
    method in its first or last characters); an answer of the client's is not answered."""
    if (values := json_values(line, bound)) <= bound:
        return None
    reason = (
        f"the message holds {values} JSON values or more; the limit (server.max_body_elements) is {bound}"
    )
    head, tail = line[:_EDGE], line[-_EDGE:]
    if b'"method"' not in head and b'"method"' not in tail:
        return Malformed(reason, None)
    return refusal(reason, request_id_of(head, tail))


def not_utf8(line: bytes) -> Malformed:
    """Why ``line`` is refused undecoded: it is not UTF-8, which JSON-RPC's text must be (read
    with U+FFFD in place of its bytes, a request reached its upstream changed, unsaid). Answered
    to its id when it is a request's, as a line of too many values is."""
    reason = "the line is not valid UTF-8, as JSON-RPC's text must be"
    head, tail = line[:_EDGE], line[-_EDGE:]
    if b'"method"' not in head and b'"method"' not in tail:
        return Malformed(reason, None)
    return refusal(reason, request_id_of(head, tail), types.PARSE_ERROR)


def _diagnosed(line: str, exc: ValidationError | None) -> Malformed | None:
    try:
        value: object = json.loads(line.rstrip())  # a position on the line, not past its end
    except RecursionError:
        found = request_id_of(line[:_EDGE].encode(), line[-_EDGE:].encode())
        return refusal(TOO_DEEP, found)
    except ValueError as error:
        return refusal(f"not JSON: {error}", None, types.PARSE_ERROR)
    if isinstance(value, list):
        return _batch(value)
    if not isinstance(value, dict):
        return refusal(f"a message must be a JSON object, not {_kind(value)}", None)
    return _checked(value, exc)


def _batch(values: list[Any]) -> Malformed:
    ids = [_usable(value.get("id")) for value in values if isinstance(value, dict) and "method" in value]
    single = ids[0] if len(ids) == 1 else None
    reason = "a batch (JSON array): MCP does not use batches, send each message on a line of its own"
    return refusal(reason, single)


def _checked(message: dict[str, Any], exc: ValidationError | None) -> Malformed | None:
    if "method" not in message and ("result" in message or "error" in message):
        kind = "JSONRPCResponse" if "result" in message else "JSONRPCError"
        reason = _sdk_reason(exc, kind) or (types.INVALID_REQUEST, "not a valid answer")
        return Malformed(f"an answer to id {_shown(message.get('id'))} is malformed: {reason[1]}", None)
    request_id = _usable(message.get("id"))
    if "id" in message and request_id is None:
        return refusal(f"a request id must be a string or an integer, not {_shown(message['id'])}", None)
    if (reason := _request_problem(message)) is not None:
        return refusal(reason, request_id)
    kind = "JSONRPCRequest" if "id" in message else "JSONRPCNotification"
    if (sdk := _sdk_reason(exc, kind)) is not None:
        return refusal(sdk[1], request_id, sdk[0])
    return None


def _request_problem(message: dict[str, Any]) -> str | None:
    """What a JSON object lacks to be a request (or a notification); None when nothing of the
    envelope is wrong."""
    if message.get("jsonrpc") != "2.0":
        return f'"jsonrpc" must be "2.0", not {_shown(message.get("jsonrpc"))}'
    if not isinstance(method := message.get("method"), str):
        return f"a request needs a method (a string), not {_shown(method)}"
    if (params := message.get("params")) is not None and not isinstance(params, dict):
        return f"params must be an object, not {_kind(params)}"
    return None


def _sdk_reason(exc: ValidationError | None, kind: str) -> tuple[int, str] | None:
    """The first thing the SDK's reading found wrong (what JSON parsing alone does not see),
    as the message ``kind`` (a member of the SDK's union) it was meant to be."""
    if exc is None or not (errors := exc.errors(include_url=False, include_input=False)):
        return None
    first = next((error for error in errors if error["loc"][:1] == (kind,)), errors[0])
    if first["type"] == "json_invalid":
        if "recursion limit" in first["msg"]:
            return types.INVALID_REQUEST, TOO_DEEP
        return types.PARSE_ERROR, f"not JSON: {first['msg']}"
    where = ".".join(str(part) for part in first["loc"][1:])  # the first part: the union's member
    return types.INVALID_REQUEST, f"{where or 'the message'}: {first['msg']}"


def refusal(reason: str, to: types.RequestId | None, code: int = types.INVALID_REQUEST) -> Malformed:
    """``reason`` as the error a request to ``to`` is answered with."""
    error = types.ErrorData(code=code, message=reason)
    return Malformed(reason, types.JSONRPCError(jsonrpc="2.0", id=to, error=error))


def _usable(request_id: object) -> types.RequestId | None:
    """``request_id`` if it can be answered to: a string or an integer (not a boolean)."""
    if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
        return request_id
    return None


def _shown(value: object) -> str:
    """``value`` as JSON, cut short: a client chooses it."""
    return str(clipped(json.dumps(value), 64))


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
