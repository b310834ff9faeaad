"""What a request's body may hold, past its size and its number of JSON values (``limits.py``).

- Its id: the SDK reads a message whose ``id`` is not a string or an integer (an array, an
  object, a float, a boolean) as a notification and answers 202 with nothing, so the client
  waits for an answer that never comes; such a request is refused instead. A string id is at
  most ``MAX_ID_LENGTH`` characters, an integer one as many digits: every span, record and
  answer of the request carries it.
- Its method name: at most ``MAX_METHOD_LENGTH`` characters (a span is named by it, and an
  unknown method's error carries it back).
- A list's cursor: at most ``MAX_CURSOR_LENGTH`` characters (an unreadable one was answered
  with the whole of it); refused as an invalid cursor is (``-32602``).
- What the gateway keeps of its client: at most ``MAX_KEPT_BYTES`` of the params of an
  ``initialize`` (kept for the session's life) or a ``subscriptions/listen`` (the stream's,
  hours), and of any other request's ``_meta`` envelope (the modern era's client info and
  capabilities, kept for the request's).
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard

import mcp_types as types
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter

from agent_gateway.json_text import Unrepresentable, json_values, parsed
from agent_gateway.request_body import requested_id

MAX_ID_LENGTH = 256
_LONGEST_INTEGER = 10**MAX_ID_LENGTH
"""The least integer of more than ``MAX_ID_LENGTH`` digits."""
MAX_METHOD_LENGTH = 128
MAX_CURSOR_LENGTH = 256
"""A list's cursor: the gateway's own are a few dozen characters."""
MAX_KEPT_BYTES = 64 * 1024
"""The most of an ``initialize``'s params, or of a request's ``_meta``, the gateway keeps."""
MAX_INITIALIZE_VALUES = 512
"""The most JSON values of an ``initialize``'s params the gateway keeps, for the session's life
(a real one holds under 100; 4,000 held 0.94 MB a session, and a replica holds 1,000)."""
MAX_KEPT_VALUES = 4096
"""The most JSON values of a listen stream's params the gateway keeps (a listen naming its
1,000 resources holds a few thousand)."""
_LONG_LIVED = {"initialize": MAX_INITIALIZE_VALUES, "subscriptions/listen": MAX_KEPT_VALUES}
"""Requests kept whole for long (a session's life, a stream's): their params are measured,
each against its bound of values."""


def read(body: bytes, bound: int) -> tuple[tuple[str, int] | None, dict[str, Any] | None]:
    """What is wrong with ``body``'s size in JSON values (``bound`` at most), its JSON and its
    shape, and its JSON-RPC code (None: nothing); and the request it holds, if it holds one
    with nothing wrong (a notification or an answer is the SDK's to read)."""
    if (count := json_values(body, bound)) > bound:
        why = (
            f"the request holds {count} JSON values or more; the limit (server.max_body_elements) is {bound}"
        )
        return (why, types.INVALID_REQUEST), None
    try:
        message: Any = parsed(body)
    except Unrepresentable as exc:
        return (f"the request holds {exc}", types.PARSE_ERROR), None
    except ValueError:
        return None, None  # not JSON: the SDK answers that with its parse error
    except RecursionError:
        return ("the request is nested too deeply to read", types.INVALID_REQUEST), None
    # A batch (MCP has none), a number: the SDK answered with pydantic's dump of it.
    if not isinstance(message, dict):
        return ("Body must be a single JSON-RPC request or notification object", types.INVALID_REQUEST), None
    if not is_request(message):
        return None, None
    found = problem(body, message)
    return found, message if found is None else None


def problem(body: bytes, message: dict[str, Any]) -> tuple[str, int] | None:
    """What is wrong with the request ``message`` (``body`` parsed) past its size and its JSON,
    and its JSON-RPC code; None: nothing."""
    if (
        found := _id_problem(message) or _method_problem(message) or _kept_problem(body, message)
    ) is not None:
        return found, types.INVALID_REQUEST
    if (found := _cursor_problem(message)) is not None:
        return found, types.INVALID_PARAMS  # as the spec answers an invalid cursor
    return None


def answerable_id(body: bytes) -> types.RequestId | None:
    """The id a refusal of request ``body`` is answered by: its own, as its first kilobyte
    tells it, when it is one (a string or an integer, not too long); else None (null)."""
    found = requested_id(body)
    if found is None or isinstance(found, bool) or not isinstance(found, str | int) or too_long(found):
        return None
    return found


def is_request(message: Any) -> TypeGuard[dict[str, Any]]:
    """Whether ``message`` is one JSON-RPC request (not a notification, an answer or a batch)."""
    return isinstance(message, dict) and "id" in message and "method" in message


def _id_problem(message: dict[str, Any]) -> str | None:
    request_id = message["id"]
    if request_id is None or isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return f"a request id must be a string or an integer, not {type(request_id).__name__}"
    if isinstance(request_id, str) and len(request_id) > MAX_ID_LENGTH:
        return f"a request id of {len(request_id)} characters; the limit is {MAX_ID_LENGTH}"
    if isinstance(request_id, int) and too_long(request_id):  # compared as a number, never written out
        return f"a request id of over {MAX_ID_LENGTH} digits; the limit is {MAX_ID_LENGTH} characters"
    return None


def too_long(request_id: str | int) -> bool:
    """Whether ``request_id`` is longer than ``MAX_ID_LENGTH`` characters (an integer: digits)."""
    if isinstance(request_id, int):
        return abs(request_id) >= _LONGEST_INTEGER
    return len(request_id) > MAX_ID_LENGTH


def _method_problem(message: dict[str, Any]) -> str | None:
    method = message["method"]
    if isinstance(method, str) and len(method) > MAX_METHOD_LENGTH:  # not a string: the SDK's to refuse
        # A span is named by it, and an unknown method's error carries it back.
        return f"a method name of {len(method)} characters; the limit is {MAX_METHOD_LENGTH}"
    return None


def _cursor_problem(message: dict[str, Any]) -> str | None:
    # FastMCP's lists (prompts, resources, templates) answered an unreadable cursor with the
    # whole of it: 3.5 MB sent back for 3.5 MB sent, each time.
    params = message.get("params")
    cursor = params.get("cursor") if isinstance(params, dict) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if isinstance(cursor, str) and len(cursor) > MAX_CURSOR_LENGTH:
        return f"a cursor of {len(cursor)} characters; the gateway's own are at most {MAX_CURSOR_LENGTH}"
    return None


def _kept_problem(body: bytes, message: dict[str, Any]) -> str | None:
    """Why ``message`` holds more of its client than the gateway keeps: an ``initialize``'s
    params are kept for the session's life, a listen stream's for hours, any other request's
    ``_meta`` envelope (the modern era's client info and capabilities) for the request's.
    Parsed, a 900 KB initialize of small values held 22 MB, for each of a client's 100
    sessions; a listen stream holding its payload beside ``_meta``, 25 MB."""
    method = message.get("method")
    # Small values parse to many times their text: 64 KiB of empty lists kept 2.35 MB a
    # session, and each anonymous address has its 100.
    bound = _LONG_LIVED.get(method) if isinstance(method, str) else None
    if bound is not None and (values := json_values(body, bound)) > bound:
        return f"{method} params of {values} JSON values; the gateway keeps at most {bound}"
    if len(body) <= MAX_KEPT_BYTES:  # nothing in it can be larger: the common case, unmeasured
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    kept = params if bound is not None else params.get("_meta")  # a list for a method: no set lookup  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if kept is None or (size := len(json.dumps(kept))) <= MAX_KEPT_BYTES:
        return None
    what = f"{method} params" if kept is params else "_meta"
    return f"{what} of {size} bytes; the gateway keeps at most {MAX_KEPT_BYTES} bytes of them"


def message_of(body: bytes, parsed: tuple[bytes, Any] | None) -> JSONRPCMessage:
    """``body``'s message, validated from ``parsed`` (admission's parse of a body and what it
    holds) when that is of this very body: not parsed twice (4 ms at 3.5 MB)."""
    if parsed is not None and parsed[0] == body:
        return jsonrpc_message_adapter.validate_python(parsed[1], by_name=False)
    return jsonrpc_message_adapter.validate_json(body, by_name=False)
