"""FastMCP's internals the gateway uses (verified against fastmcp 4.1.2): its low-level
``mcp`` server, where the gateway adds its middleware and its own handlers (FastMCP has no
public accessor for it; everything used on it is ``mcp``'s public API), its root
low-level middleware, which the gateway's own methods skip, and its lifespan, which stdio
serving enters itself (``run_stdio``)."""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol, cast

import anyio
from fastmcp import FastMCP
from fastmcp.server.context import reset_transport, set_transport
from fastmcp.server.low_level import FastMCPServerMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError

from agent_gateway.downstream.stdin import StdinLines


def lowlevel_server(server: FastMCP[Any]) -> Server[Any]:
    """The ``mcp`` low-level server FastMCP serves through."""
    lowlevel: Server[Any] = server._mcp_server  # pyright: ignore[reportPrivateUsage]
    return lowlevel


class _WhereFastMCPServes:
    """FastMCP's root low-level middleware, entered only for the methods FastMCP serves.

    For every request it binds FastMCP's request context, re-applies its lifespan's shared
    context and opens a tracing seam; for a method whose handler is the gateway's own, none
    of that is read (the pipeline has the request's context, identity and span), so it is
    a cost on every forwarded call and nothing else."""

    def __init__(self, inner: Any, own: frozenset[str]) -> None:
        self._inner = inner
        self._own = own

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method in self._own:
            return await call_next(ctx)
        return await self._inner(ctx, call_next)


def past_fastmcp(lowlevel: Server[Any], own: frozenset[str]) -> None:
    """Requests for ``own`` (methods whose handlers the gateway registered itself) skip
    FastMCP's root middleware; every other request still passes it."""
    for index, middleware in enumerate(lowlevel.middleware):
        if isinstance(middleware, FastMCPServerMiddleware):
            lowlevel.middleware[index] = _WhereFastMCPServes(middleware, own)
            return
    raise RuntimeError("FastMCP's root middleware is not in its low-level server's chain")


async def run_stdio(server: FastMCP[Any], requests: StdinLines) -> None:
    """What FastMCP's ``run_stdio_async`` does, the client's requests read from ``requests``
    instead of the SDK's reader of fd 0, which a stop could not interrupt; a request too long
    to read, or malformed, is answered with an error on the SDK's stream to stdout. The rest
    is theirs: FastMCP's transport marker and lifespan, the SDK's stdio transport (stdout
    claimed as it claims it), the low-level server's loop."""
    token = set_transport("stdio")
    try:
        lowlevel = lowlevel_server(server)
        async with (
            server._lifespan_manager(),  # pyright: ignore[reportPrivateUsage]
            # The SDK reads any object its loop can iterate over; its hint names its own.
            stdio_server(stdin=cast(anyio.AsyncFile[str], requests)) as (read, write),
        ):
            requests.refuse = partial(_refused, write)
            await lowlevel.run(read, write, lowlevel.create_initialization_options())
    finally:
        reset_transport(token)


class _Sends(Protocol):
    """The SDK's stream of messages to stdout (its type is in a private module)."""

    async def send(self, item: SessionMessage, /) -> None: ...


async def _refused(write: _Sends, answer: JSONRPCError) -> None:
    await write.send(SessionMessage(answer))
