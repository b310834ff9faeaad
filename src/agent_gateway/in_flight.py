"""The process's bound on bytes of upstream answers (and client requests) in flight, and how
an answer is written.

An upstream's answer is held by the gateway from the moment its first byte is read until the
client's HTTP exchange that carries it has been written. Without a bound, a few clients
asking for large results at once grow the process without end (three 40 MB results held
+700 MB). Accounting, against one counter for the whole process (memory is the process's):

- **read**: the HTTP upstream transport and the stdio reader take each answer's bytes as
  they arrive and give them back once the message is parsed. When they do not fit, the rest
  of that answer is dropped unread and its call fails saying why;
- **held**: the pipeline takes a result's size once it is back (``hold``), and the
  exchange's ``Outflow`` gives it back when the answer has been written (or the client went
  away). When it does not fit, the call gets ``GatewayBusy`` and nothing is written. One
  client holds at most half the bound: a client that asks for large answers and reads them
  slowly (or never, until the listener's write deadline drops it) leaves the other half to
  everyone else.

A client's request body counts against the same bound and share from its first read until
the request has been served (``BodyHeld``, taken by admission): over it, the request is
refused (503) before its body is read further.

``Outflow`` also writes a large body in slices: uvicorn hands a body to the socket's
transport whole, and what the socket does not take at once is copied into the transport's
buffer; a slice at a time, uvicorn waits for the buffer to drain before the next, so a
result is never copied a second time on its way out. Once a large answer is let go, the memory
it used is given back to the system (``memory.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    GetPromptResult,
    ImageContent,
    ReadResourceResult,
    TextContent,
    TextResourceContents,
)
from opentelemetry import metrics
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.errors import GatewayBusy
from agent_gateway.memory import LARGE, TRIMMER
from agent_gateway.refusals import refused

if TYPE_CHECKING:
    from agent_gateway.access import Principal

DEFAULT_LIMIT = 256 * 2**20
SHARE = 2
"""One client may hold at most ``1 / SHARE`` of the bound."""
SLICE = 2**20
BODY_SHARE = 4
"""One client's request bodies (with its answers) may hold at most ``1 / BODY_SHARE`` of the bound."""
UNCOUNTED = 64 * 2**10
"""Bytes of a request body not counted as held (``BodyHeld``)."""
"""Bytes of a response body handed to the server at a time."""
_SCOPE_KEY = "agent_gateway.outflow"


class InFlight:
    """Bytes of upstream answers the process holds, under one bound."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.held = 0
        self.bodies = 0
        """Of ``held``, request bodies' bytes: at most half the bound, the rest kept for answers."""

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes held; False (nothing counted) when they do not fit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held = max(0, self.held - size)
        if size >= LARGE:
            TRIMMER.after_large()

    def over_share(self, client: Principal, size: int) -> GatewayBusy:
        """The error for a client whose answers held would pass its share (counted, logged)."""
        share = self.limit // SHARE
        refused(
            "in_flight",
            "an answer of %s bytes refused: client %s holds %s of its %s",
            size,
            client.label,
            client.held,
            share,
            peer=client.label,
        )
        return GatewayBusy(
            f"client {client.subject!r} holds {_mib(client.held)} of answers not yet written, "
            f"its share of the gateway's bound is {_mib(share)} (this answer {_mib(size)}); "
            "read them, or retry shortly"
        )

    def busy(self, size: int) -> GatewayBusy:
        """The error for an answer of ``size`` bytes that did not fit (counted and logged)."""
        refused(
            "in_flight",
            "an answer of %s bytes refused: %s of %s bytes in flight",
            size,
            self.held,
            self.limit,
        )
        return GatewayBusy(
            f"the gateway holds its bound of {_mib(self.limit)} of answers in flight "
            f"({_mib(self.held)} now; this answer {_mib(size)}); retry shortly"
        )


IN_FLIGHT = InFlight()
"""The process's one bound (``server.max_bytes_in_flight`` sets its limit)."""


@asynccontextmanager
async def bounded(limit: int) -> AsyncIterator[None]:
    """``IN_FLIGHT`` under ``limit`` while a gateway runs (the one before it after)."""
    previous, IN_FLIGHT.limit = IN_FLIGHT.limit, limit
    try:
        yield
    finally:
        IN_FLIGHT.limit = previous


metrics.get_meter("agent-gateway").create_observable_gauge(
    "agent_gateway.in_flight.bytes",
    callbacks=[lambda _: [metrics.Observation(IN_FLIGHT.held)]],
    unit="By",
    description="Bytes of upstream answers held between reading them and writing them to a client",
)


class BodyHeld:
    """The bytes of one client's request body, from its first read until the request has been
    served (the body is kept that long), counted against the same bound and share as its
    answers: without, one address's 512 connections each holding 4 MiB of a body it never
    finished took 2 GB for as long as the body timeout, again and again. A body's first
    ``UNCOUNTED`` bytes are not counted: nearly every body is smaller, and the connection
    bounds hold those (512 an address, 32 MiB)."""

    __slots__ = ("client", "size")

    def __init__(self, client: Principal) -> None:
        self.client = client
        self.size = 0

    def take(self, size: int) -> GatewayBusy | None:
        """Count ``size`` more bytes; the error (counted, logged) when they do not fit."""
        # A client's bodies take at most half of what bodies may take (a quarter of the bound):
        # one client alone never fills it.
        client, share = self.client, IN_FLIGHT.limit // BODY_SHARE
        if client.held + size > share:
            refused(
                "in_flight",
                "a request body refused: client %s holds %s of its %s",
                client.label,
                client.held,
                share,
                peer=client.label,
            )
            return GatewayBusy(
                f"client {client.subject!r} holds {_mib(client.held)} of requests and answers in flight, "
                f"its share of the gateway's bound is {_mib(share)}; retry shortly"
            )
        # Bodies take at most half the bound: two clients' unfinished bodies, each within its
        # share, otherwise left no room for anyone's answers.
        if IN_FLIGHT.bodies + size > IN_FLIGHT.limit // 2 or not IN_FLIGHT.take(size):
            refused(
                "in_flight",
                "a request body refused: %s of %s bytes in flight (%s of them bodies)",
                IN_FLIGHT.held,
                IN_FLIGHT.limit,
                IN_FLIGHT.bodies,
            )
            return GatewayBusy(
                f"the gateway holds its bound of request bodies in flight ({_mib(IN_FLIGHT.bodies)} of "
                f"{_mib(IN_FLIGHT.limit // 2)}, half its {_mib(IN_FLIGHT.limit)} in flight); retry shortly"
            )
        client.held += size
        IN_FLIGHT.bodies += size
        self.size += size
        return None

    def release(self) -> None:
        if self.size:
            IN_FLIGHT.give(self.size)
            IN_FLIGHT.bodies = max(0, IN_FLIGHT.bodies - self.size)
            self.client.held = max(0, self.client.held - self.size)
            self.size = 0


def hold(scope: Scope | None, result: Any, client: Principal | None = None) -> None:
    """Count ``result`` as held, for ``client``, until its exchange ``scope`` has been written.

    Outside an HTTP exchange (the gateway served over stdio) nothing is held: one client,
    whose answers are written as they come.

    Raises:
        GatewayBusy: the bound, or the client's share of it, is reached; ``result`` must not
            be sent.
    """
    held = scope.get(_SCOPE_KEY) if scope is not None else None
    if not isinstance(held, _Held) or held.closed:
        return  # no exchange, or it ended (the client went away): nothing will be written
    size = result_size(result)
    if client is not None and client.held + size > IN_FLIGHT.limit // SHARE:
        raise IN_FLIGHT.over_share(client, size)
    if not IN_FLIGHT.take(size):
        raise IN_FLIGHT.busy(size)
    held.size += size
    if client is not None:
        client.held += size
        held.client = client


def result_size(result: Any) -> int:
    """About how many bytes ``result`` holds: the strings in it, wherever they are (content,
    structured content, completion values, ``_meta``; numbers and structure are small beside
    them). The common results are read field by field (a call's every answer is sized)."""
    if isinstance(result, CallToolResult):
        size = sum(_content_size(c) for c in result.content) + _json_size(result.structured_content)
    elif isinstance(result, ReadResourceResult):
        size = sum(_resource_size(c) for c in result.contents)
    elif isinstance(result, GetPromptResult):
        size = sum(_content_size(m.content) for m in result.messages)
    else:  # a completion's values, anything else: every string in it
        return _json_size(result)
    return size + _json_size(result.meta) if result.meta else size


def _content_size(content: Any) -> int:
    if isinstance(content, TextContent):
        size = len(content.text)
    elif isinstance(content, ImageContent | AudioContent):
        size = len(content.data)
    elif isinstance(content, EmbeddedResource):
        size = _resource_size(content.resource)
    else:  # a resource link: its URI, name, description, _meta, ...
        return _json_size(content)
    return size + _json_size(content.meta) if content.meta else size


def _resource_size(resource: Any) -> int:
    if isinstance(resource, TextResourceContents):
        size = len(resource.text)
    elif isinstance(resource, BlobResourceContents):
        size = len(resource.blob)
    else:  # its _meta among its strings
        return _json_size(resource)
    return size + _json_size(resource.meta) if resource.meta else size


def _json_size(value: Any) -> int:
    """The strings' lengths in ``value``, a JSON value or a model of one (numbers and structure
    are small beside them). Walked with a stack: an upstream's answer may be nested as deep as
    its parser let it."""
    size = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, dict):
            size += sum(len(key) for key in item)  # pyright: ignore[reportUnknownArgumentType]
            stack.extend(item.values())  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(item, list | tuple):
            stack.extend(item)  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(item, BaseModel):
            stack.extend(item.__dict__.values())
            if item.__pydantic_extra__:
                stack.append(item.__pydantic_extra__)
        elif isinstance(item, bytes):
            size += len(item)
    return size


class _Held:
    """What one exchange holds; closed once it ended, after which it holds nothing more."""

    __slots__ = ("client", "closed", "size")

    def __init__(self) -> None:
        self.size = 0
        self.closed = False
        self.client: Principal | None = None

    def release(self) -> None:
        self.closed = True
        IN_FLIGHT.give(self.size)
        if self.client is not None:
            self.client.held -= self.size


class Outflow:
    """ASGI middleware on the MCP endpoint: each exchange's held answers given back once it
    is written, and a large body written in slices (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held = scope[_SCOPE_KEY] = _Held()
        try:
            await self.app(scope, receive, _sliced(send))
        finally:
            held.release()


def _sliced(send: Send) -> Send:
    async def sliced(message: Message) -> None:
        body = message.get("body", b"")
        if message["type"] != "http.response.body" or len(body) <= SLICE:
            await send(message)
            return
        more = message.get("more_body", False)
        view = memoryview(body)
        for start in range(0, len(body), SLICE):
            last = start + SLICE >= len(body)
            await send(
                {
                    "type": "http.response.body",
                    "body": bytes(view[start : start + SLICE]),
                    "more_body": more or not last,
                }
            )

    return sliced


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"
