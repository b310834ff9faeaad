"""``tools/call`` for the catalog's tools, served straight from the proxy.

FastMCP's own ``tools/call`` path builds a Context, runs the middleware chain, looks the tool
up through every provider (a task group per call), runs ``Tool.run`` and converts the result
twice. For the catalog's tools, which only forward, that buys nothing and costs more CPU per
call than the forwarding itself. This handler replaces FastMCP's on the low-level server:
a catalog tool goes straight to the proxy, and the upstream's result goes back as it came;
any other name (a tool registered on the FastMCP server itself) goes to FastMCP's handler.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext

from agent_gateway import access
from agent_gateway.catalog import Catalog
from agent_gateway.errors import GatewayError, NotAllowed
from agent_gateway.proxy import Caller, Proxy
from agent_gateway.sessions import SessionRegistry

logger = logging.getLogger(__name__)

ToolResult = types.CallToolResult | types.InputRequiredResult
Handler = Callable[[ServerRequestContext[Any, Any], types.CallToolRequestParams], Awaitable[Any]]


class ToolCalls:
    """The low-level ``tools/call`` handler."""

    def __init__(self, catalog: Catalog, proxy: Proxy, sessions: SessionRegistry, fallback: Handler) -> None:
        self._catalog = catalog
        self._proxy = proxy
        self._sessions = sessions
        self._fallback = fallback

    async def __call__(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        if params.name not in self._catalog.snapshot.tools:
            try:  # the gateway's own tools (ask_agent) are under the client's policy too
                access.check("tool", params.name)
            except NotAllowed as exc:
                return _error_result(exc)
            return await self._fallback(ctx, params)
        async with self._sessions.serving(ctx) as session:
            meta = ctx.params.get("_meta") if ctx.params is not None else None
            caller = Caller.of_request(session, ctx.session, ctx.request_id, meta, params)
            try:
                return await self._proxy.call_tool(params.name, params.arguments or {}, caller)
            except GatewayError as exc:
                return _error_result(exc)


def _error_result(exc: GatewayError) -> types.CallToolResult:
    # A tool's failure is a result the model can read, not a protocol error.
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
