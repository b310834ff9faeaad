"""Tools of a test server on the SDK's low-level server, described as FastMCP describes them.

The suite starts its stdio test servers hundreds of times a run, and FastMCP costs each start
~0.5 s of CPU more than the SDK's server (its components, schemas and settings). A server
built here says what a FastMCP server says: each tool's title, its arguments an object
(``additionalProperties: false``, those without a default required), its result
``{"result": <value>}`` as structured content and as text, an exception's message as an
``isError`` result. ``Tools(marks=True)`` adds FastMCP's own marks too (``_meta.fastmcp``,
``x-fastmcp-wrap-result``, the ``Error calling tool`` prefix) and its refusal of a missing or
unknown argument, for a server whose listings and answers must stay byte for byte what
FastMCP sent (``recorder.py``).
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic.version import VERSION

_PYDANTIC = ".".join(VERSION.split(".")[:2])

Context = ServerRequestContext[Any]
Handler = Callable[[Context, dict[str, Any]], Any]

# FastMCP's keys on a connection's state: the level logging/setLevel asked, the session's id.
_LEVEL_KEY = "_fastmcp_client_log_level"
_SESSION_KEY = "_fastmcp_state_prefix"
_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
TAGS = {"fastmcp": {"tags": []}}
"""The ``_meta`` FastMCP puts on each tool, resource, template and prompt it lists."""


class Tools:
    """The tools of one server, each registered by ``tool``."""

    def __init__(self, marks: bool = False) -> None:
        self._tools: dict[str, tuple[types.Tool, Handler, bool]] = {}
        self._marks = marks

    def tool(
        self,
        name: str,
        description: str,
        returns: dict[str, Any] | str,
        properties: dict[str, dict[str, Any]] | None = None,
        title: str | None = None,
        wrap: bool = True,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated handler as tool ``name``; ``returns`` is its result's JSON
        Schema (a type name alone for a plain type); ``wrap=False`` for an object result,
        which FastMCP sends as the structured content itself."""
        properties = properties or {}
        required = [key for key, schema in properties.items() if "default" not in schema]
        arguments: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": properties,
        }
        result = returns if isinstance(returns, dict) else {"type": returns}
        output = {"type": "object", "properties": {"result": result}, "required": ["result"]}
        if self._marks:
            output["x-fastmcp-wrap-result"] = True
        tool = types.Tool(
            name=name,
            title=title or name.replace("_", " ").title(),
            description=description,
            input_schema=arguments | ({"required": required} if required else {}),
            output_schema=output if wrap else result,
            _meta=TAGS if self._marks else None,
        )

        def register(handler: Handler) -> Handler:
            self._tools[name] = (tool, handler, wrap)
            return handler

        return register

    async def list_tools(self, _: Context, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for tool, _, _ in self._tools.values()])

    async def call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        known = self._tools.get(params.name)
        if known is None:
            return _error(f"Unknown tool: {params.name!r}")
        arguments = params.arguments or {}
        if self._marks and (invalid := _invalid(params.name, known[0].input_schema, arguments)):
            return _error(invalid)
        try:
            value = known[1](ctx, arguments)
            if inspect.isawaitable(value):
                value = await value
        except MCPError as exc:  # a capability the client lacks is the request's error (SEP-2575)
            if exc.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY:
                raise
            return self._failed(params.name, exc)
        except Exception as exc:  # as FastMCP answers a tool's error: its message, isError
            return self._failed(params.name, exc)
        if isinstance(value, types.InputRequiredResult):
            return value
        return self._result(value, known[2])

    def _failed(self, name: str, exc: Exception) -> types.CallToolResult:
        return _error(f"Error calling tool {name!r}: {exc}" if self._marks else str(exc))

    def _result(self, value: Any, wrapped: bool) -> types.CallToolResult:
        # FastMCP's text: the string itself, else compact JSON (non-ASCII kept, as pydantic does).
        text = (
            value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        )
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content={"result": value} if wrapped else value,
            _meta={"fastmcp": {"wrap_result": True}} if wrapped and self._marks else None,
        )

    def server(self, name: str, instructions: str | None = None, **handlers: Any) -> Server[Any]:
        """A server of these tools, with FastMCP's empty prompts, resources and templates and
        its logging capability; ``handlers`` (``on_*``, ``version``) add to them or replace them."""
        defaults: dict[str, Any] = {
            "on_list_prompts": lambda ctx, params: _no_prompts(),
            "on_list_resources": lambda ctx, params: _no_resources(),
            "on_list_resource_templates": lambda ctx, params: _no_templates(),
            "on_set_logging_level": _set_level,
        }
        with warnings.catch_warnings():  # logging/setLevel is deprecated in the modern era; FastMCP serves it
            warnings.simplefilter("ignore")
            return Server(
                name,
                instructions=instructions,
                on_list_tools=self.list_tools,
                on_call_tool=self.call_tool,
                **(defaults | handlers),
            )


async def serve_stdio(server: Server[Any]) -> None:
    """Serve ``server`` on stdin and stdout, announcing list changes as FastMCP does."""
    changed = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(changed))


async def report_progress(ctx: Context, progress: float, total: float, message: str | None = None) -> None:
    """Progress on the call's own stream, when its caller asked for it (FastMCP's rule)."""
    token = ctx.meta.get("progress_token") if ctx.meta is not None else None
    if token is not None:
        await ctx.session.send_progress_notification(
            token, progress, total, message, related_request_id=str(ctx.request_id)
        )


def session_id(ctx: Context) -> str:
    """What FastMCP's ``ctx.session_id`` is: the HTTP session's id, else one made up for the
    connection (a handshake-era stdio session; each request of a modern one)."""
    connection = getattr(ctx.session, "_connection", None)
    state: dict[str, Any] = connection.state if connection is not None else {}
    if (cached := state.get(_SESSION_KEY)) is not None:
        return cached
    known = connection.session_id if connection is not None else None
    if known is None and ctx.request is not None:
        known = ctx.request.headers.get("mcp-session-id")
    state[_SESSION_KEY] = known = known or str(uuid4())
    return known


async def log(ctx: Context, text: str, level: str = "info") -> None:
    """FastMCP's ``ctx.log``: ``{"msg", "extra"}`` on the call's stream, unless below the
    level the client set (the SDK applies a modern request's own ``_meta`` level)."""
    connection = getattr(ctx.session, "_connection", None)
    floor = connection.state.get(_LEVEL_KEY) if connection is not None else None
    if floor is not None and _LEVELS.index(level) < _LEVELS.index(floor):
        return
    with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
        await ctx.session.send_log_message(
            level,  # pyright: ignore[reportArgumentType]
            {"msg": text, "extra": None},
            related_request_id=str(ctx.request_id),
        )


async def elicit_text(ctx: Context, question: str) -> types.ElicitResult:
    """FastMCP's ``ctx.elicit(question, response_type=str)``: a form of one string ``value``."""
    value = {"title": "Value", "type": "string"}
    schema = {"type": "object", "properties": {"value": value}, "required": ["value"]}
    return await ctx.session.elicit_form(question, schema, related_request_id=str(ctx.request_id))


def _invalid(name: str, schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Pydantic's words, as FastMCP answered a missing or unknown argument (the tool not run)."""
    wrong = [(key, "Missing required argument", "missing_argument", arguments)
             for key in schema.get("required", []) if key not in arguments]  # fmt: skip
    wrong += [(key, "Unexpected keyword argument", "unexpected_keyword_argument", value)
              for key, value in arguments.items() if key not in schema["properties"]]  # fmt: skip
    if not wrong:
        return None
    lines = [f"{len(wrong)} validation error{'s' if len(wrong) > 1 else ''} for call[{name}]"]
    for key, message, kind, value in wrong:
        lines += [key, f"  {message} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]"]
        lines.append(f"    For further information visit https://errors.pydantic.dev/{_PYDANTIC}/v/{kind}")
    return "\n".join(lines)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def _set_level(ctx: Context, params: types.SetLevelRequestParams) -> types.EmptyResult:
    connection = getattr(ctx.session, "_connection", None)
    if connection is not None:  # where FastMCP keeps it: what ``log`` filters by
        connection.state[_LEVEL_KEY] = params.level
    return types.EmptyResult()


async def _no_prompts() -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[])


async def _no_resources() -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[])


async def _no_templates() -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[])
