"""Guards in front of the MCP endpoint for what the SDK's HTTP transport lets through badly.

- The body limit: a body over ``server.max_body_bytes`` is refused with 413 and a JSON-RPC
  error before any of it is parsed. A declared ``Content-Length`` is refused up front; a
  chunked body is counted as it arrives and refused as soon as it passes the limit.
- The request id: the SDK reads a message whose ``id`` is not a string or an integer (an
  array, an object, a float, a boolean) as a notification and answers 202 with nothing, so
  the client waits for an answer that never comes. Such a request gets a JSON-RPC
  ``Invalid Request`` error instead (with a null id, as JSON-RPC says for an unreadable id).

The body is read here in full (the SDK reads it in full too) and handed on unchanged.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

INVALID_REQUEST = -32600


class RequestGuard:
    """ASGI middleware: the body limit and the request-id check (see the module docstring)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _refuse(send, 413, self._too_large(f"{declared} bytes"))
            return
        body = await self._read(receive)
        if body is _GONE:
            return  # the client left before its body was whole: nothing to answer
        if body is None:
            await _refuse(send, 413, self._too_large(f"over {self.limit} bytes"))
            return
        if (problem := _id_problem(body)) is not None:
            await _refuse(send, 400, problem)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body; None as soon as it passes the limit; ``_GONE`` if the client left."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _too_large(self, size: str) -> str:
        return f"request body is {size}; the limit (server.max_body_bytes) is {self.limit}"


_GONE = b"\x00gone"
"""A sentinel for a body cut short by a disconnect (compared by identity)."""


def _replay(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # afterwards only a disconnect can come

    return replayed


def _id_problem(body: bytes) -> str | None:
    if b'"id"' not in body:
        return None
    try:
        message: Any = json.loads(body)
    except ValueError:
        return None  # not JSON: the SDK answers that with its parse error
    except RecursionError:
        return "the request is nested too deeply to read"
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        return None
    request_id = message["id"]
    if request_id is None or isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return f"a request id must be a string or an integer, not {type(request_id).__name__}"
    return None


async def _refuse(send: Send, status: int, message: str) -> None:
    logger.warning("refused an HTTP request: %s", message)
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}})
    data = body.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
