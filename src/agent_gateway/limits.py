"""The HTTP request body limit: a body over ``server.max_body_bytes`` is refused with 413 and
a JSON-RPC error before the MCP layer parses (and holds) any of it.

A declared ``Content-Length`` is refused up front. A chunked body is counted as it arrives;
past the limit the rest is not read, the client gets the same answer, and the app sees a
disconnect, so nothing half-read is handled.
"""

from __future__ import annotations

import json
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

INVALID_REQUEST = -32600


class BodyLimit:
    """ASGI middleware refusing request bodies larger than ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(send, declared)
            return
        received = 0
        refused = False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    refused = True
                    await self._refuse(send, None)
                    return {"type": "http.disconnect"}
            return message

        async def sent(message: Message) -> None:
            if not refused:  # once refused, the client has its answer: the app's is dropped
                await send(message)

        await self.app(scope, counted, sent)

    async def _refuse(self, send: Send, size: int | None) -> None:
        told = f"{size} bytes" if size is not None else f"over {self.limit} bytes"
        message = f"request body is {told}; the limit (server.max_body_bytes) is {self.limit}"
        logger.warning("refused an HTTP request: %s", message)
        body = json.dumps(
            {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
