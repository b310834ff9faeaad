"""FastMCP's internals the gateway uses (verified against fastmcp 4.1.2): its low-level
``mcp`` server, where the gateway adds its middleware and its own handlers (FastMCP has no
public accessor for it; everything used on it is ``mcp``'s public API), and its root
low-level middleware, which the gateway's own methods skip."""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from fastmcp.server.low_level import FastMCPServerMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server


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
