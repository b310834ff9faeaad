"""The one path of every client request that reaches an upstream: ``tools/call``,
``prompts/get``, ``resources/read`` and ``completion/complete``.

Each is served here, on the low-level server, in four steps:

1. **identified**: the client is the one the request's own verified token (or, without
   auth, its address) names, carried on the ``Caller``; a request without one where auth
   is on is refused (never "allowed, as nobody in particular");
2. **resolved**: the public name looked up once in the catalog snapshot (``Proxy``);
3. **authorized**: that client's policy, once, from the identity on the call (``Proxy``);
4. **forwarded**: to the upstream session, with its timeout, cancellation and relays
   (``Proxy`` → ``upstreams.session``).

Telemetry, the access log, the audit trail and admission wrap the handler as low-level
middleware (``server.Gateway``), once per client request. The gateway's own tools are served
here too, with the same identity: ``ask_agent`` runs the agent for the request's client and
caller (``agent.tool``), ``call_tool`` is unwrapped onto the catalog's path, ``search_tools``
answered from the tool index. FastMCP's own ``tools/call`` path serves nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.context import ServerRequestContext

from agent_gateway.access import AccessControl, Principal
from agent_gateway.activity import refused
from agent_gateway.agent.tool import AgentTool
from agent_gateway.catalog import Catalog
from agent_gateway.config import SearchConfig
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.sessions import DownstreamSession, SessionRegistry
from agent_gateway.errors import (
    REFUSALS,
    GatewayError,
    InvalidArguments,
    NotAllowed,
    UpstreamAnswered,
    shown,
    to_wire,
)
from agent_gateway.in_flight import hold
from agent_gateway.proxy import Proxy
from agent_gateway.search.engine import ToolSearch
from agent_gateway.search.tools import (
    CALL_TOOL,
    SEARCH_TOOLS,
    call_request,
    search_request,
    search_result,
    within_answer,
)
from agent_gateway.turns import away

logger = logging.getLogger(__name__)

ToolResult = types.CallToolResult | types.InputRequiredResult
Context = ServerRequestContext[Any, Any]
R = TypeVar("R")


class Pipeline:
    """The low-level handlers of the four forwarded methods."""

    def __init__(
        self,
        access: AccessControl,
        catalog: Catalog,
        proxy: Proxy,
        sessions: SessionRegistry,
        agent: AgentTool | None = None,
        search: ToolSearch | None = None,
        search_config: SearchConfig | None = None,
        own: frozenset[str] = frozenset(),
        public_uri: Callable[[str], str] = str,
    ) -> None:
        """``agent``: serve ``ask_agent`` (None: the agent is off); ``search``:
        serve ``search_tools`` and ``call_tool`` (None: search mode is off); ``own``: the
        names of the gateway's own tools, which ``call_tool`` does not call; ``public_uri``:
        a URI as the catalog knows it, from the spelling a client was listed."""
        self._own = own | {SEARCH_TOOLS, CALL_TOOL}
        self._access = access
        self._catalog = catalog
        self._proxy = proxy
        self._sessions = sessions
        self._agent = agent
        self._search = search
        self._search_config = search_config or SearchConfig()
        self._public_uri = public_uri

    async def call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> Any:
        name = params.name
        client = self._access.identify(ctx.request)
        if self._search is not None and name in (SEARCH_TOOLS, CALL_TOOL):
            try:
                if name == SEARCH_TOOLS:  # its result holds whole tool schemas: held as any
                    found = await self._search_tools(params.arguments or {}, client)
                    hold(_scope(ctx), found, client)
                    return found
                params = _unwrapped(params)
            except GatewayError as exc:
                return _error_result(exc)
            if params.name in self._own:
                return _error_result(
                    InvalidArguments(
                        CALL_TOOL, f"it calls the catalog's tools; call {params.name!r} directly"
                    )
                )
        elif self._agent is not None and name == self._agent.name:
            return await self._ask_agent(ctx, client, params)
        try:
            async with self._sessions.serving(ctx) as session:
                caller = _caller(ctx, session, client, params)
                try:
                    async with away():  # the upstream's time: its client's next request is worked on
                        result = await self._proxy.call_tool(
                            params.name, params.arguments or {}, caller, held=True
                        )
                finally:  # ended (or cancelled): what the upstream still asks its client is withdrawn
                    await caller.withdraw_questions()
            hold(_scope(ctx), result, client)
        except GatewayError as exc:
            return _error_result(exc)
        return result

    async def _ask_agent(
        self, ctx: Context, client: Principal | None, params: types.CallToolRequestParams
    ) -> ToolResult:
        assert self._agent is not None  # only called when the agent is on
        try:  # the gateway's own tool is under the client's policy too
            who = _authorized(client, params.name)
        except NotAllowed as exc:
            return _error_result(exc)
        async with self._sessions.serving(ctx) as session:
            caller = _caller(ctx, session, who, params)
            try:
                async with away():  # a run's wait on models and tools
                    return await self._agent.call(params.arguments or {}, who, caller)
            finally:  # its tool calls' questions too
                await caller.withdraw_questions()

    async def get_prompt(
        self, ctx: Context, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        return await self._answered(
            ctx, params, lambda caller: self._proxy.get_prompt(params.name, params.arguments, caller)
        )

    async def read_resource(
        self, ctx: Context, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        uri = self._public_uri(params.uri)
        return await self._answered(ctx, params, lambda caller: self._proxy.read_resource(uri, caller))

    async def complete(self, ctx: Context, params: types.CompleteRequestParams) -> types.CompleteResult:
        return await self._answered(ctx, None, lambda caller: self._proxy.complete(params, caller))

    async def _answered(
        self,
        ctx: Context,
        params: types.InputResponseRequestParams | None,
        forward: Callable[[Caller], Awaitable[R]],
    ) -> R:
        """``forward`` for the request's caller; a gateway error is the JSON-RPC error
        ``errors.to_wire`` makes of it (a tool's failure is a result instead: ``call_tool``)."""
        async with self._sessions.serving(ctx) as session:
            client = self._access.identify(ctx.request)
            caller = _caller(ctx, session, client, params)
            try:
                async with away():
                    result = await forward(caller)
                hold(_scope(ctx), result, client)
            except GatewayError as exc:
                raise to_wire(exc) from exc
            finally:
                await caller.withdraw_questions()
        return result

    async def _search_tools(
        self, arguments: dict[str, Any], client: Principal | None
    ) -> types.CallToolResult:
        assert self._search is not None  # only called when search is on
        if client is None:
            raise NotAllowed("tool", SEARCH_TOOLS, "(no identity)")
        request = search_request(arguments)
        snapshot = self._catalog.snapshot
        with client.calling():  # a search is a call in flight, under max_concurrency as any
            found, total = await self._search.search(
                snapshot,
                request.query,
                request.limit or self._search_config.limit,
                upstream=request.upstream,
                accept=client.tool_filter(),
                party=client.label,  # anonymous clients: each address its own
            )
        kept = within_answer(found, lambda f: snapshot.parts[f.upstream].sizes.get(f.tool.name, 0))
        logger.debug("search_tools %s: %d of %d", shown(request.query), len(kept), total)
        return search_result(kept, total, request.query, len(found) - len(kept))


def _caller(
    ctx: Context,
    session: DownstreamSession,
    client: Principal | None,
    params: types.InputResponseRequestParams | None = None,
) -> Caller:
    """The request's caller, in ``session`` (current while it is served)."""
    meta = ctx.params.get("_meta") if ctx.params is not None else None
    return Caller.of_request(session, ctx.session, ctx.request_id, meta, params, client)


def _scope(ctx: Context) -> Any:
    """The ASGI scope of the HTTP exchange that carries the request (None over stdio)."""
    return getattr(ctx.request, "scope", None)


def _authorized(client: Principal | None, name: str) -> Principal:
    """``client``, allowed to call tool ``name`` (raises ``NotAllowed``; fail closed)."""
    if client is None:
        raise NotAllowed("tool", name, "(no identity)")
    client.check("tool", name)
    return client


def _unwrapped(params: types.CallToolRequestParams) -> types.CallToolRequestParams:
    """``call_tool {name, arguments}`` as the direct call of ``name`` (raises ``InvalidArguments``)."""
    name, arguments = call_request(params.arguments or {})
    return params.model_copy(update={"name": name, "arguments": arguments})


def _error_result(exc: GatewayError) -> types.CallToolResult:
    """A tool's failure as a result the model can read, not a protocol error; but an
    upstream's "URL elicitation required" (-32042) is raised as it came: it is a step of the
    protocol the client takes (its data holds the URLs to open, then the call is retried)."""
    if isinstance(exc, UpstreamAnswered) and exc.code == types.URL_ELICITATION_REQUIRED:
        raise to_wire(exc) from exc
    if isinstance(exc, REFUSALS):
        refused(type(exc).__name__)
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
