"""Tools of a test server on the SDK's low-level server, described as FastMCP describes them.

The suite starts its stdio test servers hundreds of times a run, and FastMCP costs each start
~0.5 s of CPU more than the SDK's server (its components, schemas and settings). A server
built here says what a FastMCP server says: each tool's title, its arguments an object
(``additionalProperties: false``, those without a default required), its result
``{"result": <value>}`` as structured content and as text, an exception's message as an
``isError`` result.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server

Context = ServerRequestContext[Any]
Handler = Callable[[Context, dict[str, Any]], Any]


class Tools:
    """The tools of one server, each registered by ``tool``."""

    def __init__(self) -> None:
        self._tools: dict[str, tuple[types.Tool, Handler]] = {}

    def tool(
        self,
        name: str,
        description: str,
        returns: dict[str, Any] | str,
        properties: dict[str, dict[str, Any]] | None = None,
        title: str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated handler as tool ``name``; ``returns`` is its result's JSON
        Schema (a type name alone for a plain type)."""
        properties = properties or {}
        required = [key for key, schema in properties.items() if "default" not in schema]
        arguments: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": properties,
        }
        result = returns if isinstance(returns, dict) else {"type": returns}
        tool = types.Tool(
            name=name,
            title=title or name.replace("_", " ").title(),
            description=description,
            input_schema=arguments | ({"required": required} if required else {}),
            output_schema={"type": "object", "properties": {"result": result}, "required": ["result"]},
        )

        def register(handler: Handler) -> Handler:
            self._tools[name] = (tool, handler)
            return handler

        return register

    async def list_tools(self, _: Context, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for tool, _ in self._tools.values()])

    async def call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        known = self._tools.get(params.name)
        if known is None:
            return _error(f"Unknown tool: {params.name!r}")
        try:
            value = known[1](ctx, params.arguments or {})
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # as FastMCP answers a tool's error: its message, isError
            return _error(str(exc))
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content={"result": value}
        )

    def server(self, name: str, instructions: str | None = None) -> Server[Any]:
        """A server of these tools, with FastMCP's empty prompts, resources and templates and
        its logging capability."""
        with warnings.catch_warnings():  # logging/setLevel is deprecated in the modern era; FastMCP serves it
            warnings.simplefilter("ignore")
            return Server(
                name,
                instructions=instructions,
                on_list_tools=self.list_tools,
                on_call_tool=self.call_tool,
                on_list_prompts=lambda ctx, params: _no_prompts(),
                on_list_resources=lambda ctx, params: _no_resources(),
                on_list_resource_templates=lambda ctx, params: _no_templates(),
                on_set_logging_level=_set_level,
            )


async def serve_stdio(server: Server[Any]) -> None:
    """Serve ``server`` on stdin and stdout, announcing list changes as FastMCP does."""
    changed = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(changed))


async def report_progress(ctx: Context, progress: float, total: float) -> None:
    """Progress on the call's own stream, when its caller asked for it (FastMCP's rule)."""
    token = ctx.meta.get("progress_token") if ctx.meta is not None else None
    if token is not None:
        await ctx.session.send_progress_notification(
            token, progress, total, related_request_id=str(ctx.request_id)
        )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def _set_level(_: Context, __: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def _no_prompts() -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[])


async def _no_resources() -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[])


async def _no_templates() -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[])
