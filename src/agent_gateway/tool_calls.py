"""``tools/call`` for the catalog's tools and the search tools, served straight from the proxy.

FastMCP's own ``tools/call`` path builds a Context, runs the middleware chain, looks the tool
up through every provider (a task group per call), runs ``Tool.run`` and converts the result
twice. For the catalog's tools, which only forward, that buys nothing and costs more CPU per
call than the forwarding itself. This handler replaces FastMCP's on the low-level server:
a catalog tool goes straight to the proxy, and the upstream's result goes back as it came;
``call_tool`` is unwrapped onto that same path (so a call through it is a direct call in
everything but the name); ``search_tools`` is answered from the tool index; any other name
(a tool registered on the FastMCP server itself, ``ask_agent``) goes to FastMCP's handler.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext

from agent_gateway import access
from agent_gateway.activity import refused
from agent_gateway.catalog import Catalog
from agent_gateway.config import SearchConfig
from agent_gateway.errors import (
    ClientLimited,
    GatewayError,
    InvalidArguments,
    NotAllowed,
    ToolHeld,
    UpstreamBusy,
)
from agent_gateway.proxy import Caller, Proxy
from agent_gateway.search.engine import ToolSearch
from agent_gateway.search.tools import CALL_TOOL, SEARCH_TOOLS, call_request, search_request, search_result
from agent_gateway.sessions import SessionRegistry

logger = logging.getLogger(__name__)

ToolResult = types.CallToolResult | types.InputRequiredResult
Handler = Callable[[ServerRequestContext[Any, Any], types.CallToolRequestParams], Awaitable[Any]]


class ToolCalls:
    """The low-level ``tools/call`` handler."""

    def __init__(
        self,
        catalog: Catalog,
        proxy: Proxy,
        sessions: SessionRegistry,
        fallback: Handler,
        search: ToolSearch | None = None,
        search_config: SearchConfig | None = None,
        own: frozenset[str] = frozenset(),
    ) -> None:
        """``search``: serve ``search_tools`` and ``call_tool`` (None: search mode is off);
        ``own``: the names of the gateway's own tools, which ``call_tool`` does not call."""
        self._own = own | {SEARCH_TOOLS, CALL_TOOL}
        self._catalog = catalog
        self._proxy = proxy
        self._sessions = sessions
        self._fallback = fallback
        self._search = search
        self._search_config = search_config or SearchConfig()

    async def __call__(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        name = params.name
        if self._search is not None and name in (SEARCH_TOOLS, CALL_TOOL):
            try:
                if name == SEARCH_TOOLS:
                    return await self._search_tools(params.arguments or {})
                params = _unwrapped(params)
            except GatewayError as exc:
                return _error_result(exc)
            if params.name in self._own:
                return _error_result(
                    InvalidArguments(
                        CALL_TOOL, f"it calls the catalog's tools; call {params.name!r} directly"
                    )
                )
        elif (
            params.name not in self._catalog.snapshot.tools and params.name not in self._catalog.snapshot.held
        ):
            try:  # the gateway's own tools (ask_agent) are under the client's policy too
                access.check("tool", params.name)
            except NotAllowed as exc:
                return _error_result(exc)
            return await self._fallback(ctx, params)
        return await self._call(ctx, params)

    async def _call(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> ToolResult:
        async with self._sessions.serving(ctx) as session:
            meta = ctx.params.get("_meta") if ctx.params is not None else None
            caller = Caller.of_request(session, ctx.session, ctx.request_id, meta, params)
            try:
                return await self._proxy.call_tool(params.name, params.arguments or {}, caller)
            except GatewayError as exc:
                return _error_result(exc)

    async def _search_tools(self, arguments: dict[str, Any]) -> types.CallToolResult:
        assert self._search is not None  # only called when search is on
        request = search_request(arguments)
        client = access.current()
        found, total = await self._search.search(
            self._catalog.snapshot,
            request.query,
            request.limit or self._search_config.limit,
            upstream=request.upstream,
            accept=(lambda n: client.allows("tool", n))
            if client is not None and client.policy.tools != ("*",)
            else None,
        )
        logger.debug("search_tools %r: %d of %d", request.query, len(found), total)
        return search_result(found, total, request.query)


def _unwrapped(params: types.CallToolRequestParams) -> types.CallToolRequestParams:
    """``call_tool {name, arguments}`` as the direct call of ``name`` (raises ``InvalidArguments``)."""
    name, arguments = call_request(params.arguments or {})
    return params.model_copy(update={"name": name, "arguments": arguments})


def _error_result(exc: GatewayError) -> types.CallToolResult:
    # A tool's failure is a result the model can read, not a protocol error.
    if isinstance(exc, NotAllowed | ClientLimited | UpstreamBusy | ToolHeld):
        refused(type(exc).__name__)
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
