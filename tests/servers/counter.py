"""A stdio upstream for tests: counts calls, can change its tool list, can crash on demand.

Written on the SDK's low-level server, not FastMCP: the suite starts this server ~170 times,
and FastMCP's import cost each start 1.4-1.6 s of CPU against ~0.8 s here. What it says is
what a FastMCP server says: the same capabilities, tools, schemas and results.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server

Context = ServerRequestContext[Any]


Handler = Callable[[Context, dict[str, Any]], Any]
_tools: dict[str, tuple[types.Tool, Handler]] = {}
calls = {"n": 0}


def _tool(
    name: str,
    description: str,
    returns: str,
    title: str | None = None,
    properties: dict[str, dict[str, Any]] | None = None,
) -> Callable[[Handler], Handler]:
    """Register the decorated handler as tool ``name``, as FastMCP describes one: its
    arguments an object of ``properties`` (those without a default required), its result
    ``{"result": <returns>}``."""
    properties = properties or {}
    required = [key for key, schema in properties.items() if "default" not in schema]
    arguments: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    result = {"type": "object", "properties": {"result": {"type": returns}}, "required": ["result"]}
    tool = types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=arguments | ({"required": required} if required else {}),
        output_schema=result,
    )

    def register(handler: Handler) -> Handler:
        _tools[name] = (tool, handler)
        return handler

    return register


@_tool(
    "increment",
    "Add ``by`` to the counter and return it.",
    "integer",
    "Increment",
    {"by": {"type": "integer", "default": 1}},
)
def _increment(_: Context, arguments: dict[str, Any]) -> int:
    calls["n"] += arguments.get("by", 1)
    return calls["n"]


@_tool("pid", "This server's process id.", "integer", "Pid")
def _pid(_: Context, __: dict[str, Any]) -> int:
    return os.getpid()


@_tool(
    "add_tool",
    "Register a new tool called ``name`` (announces tools/list_changed).",
    "string",
    "Add Tool",
    {"name": {"type": "string"}},
)
async def _add_tool(ctx: Context, arguments: dict[str, Any]) -> str:
    name = str(arguments["name"])
    _tool(name, f"added at run time: {name}", "string")(lambda _ctx, _args: name)
    # On the call's own stream: a modern (2026-07-28) session drops a notification related to
    # no request, as FastMCP's Context.send_notification knows.
    await ctx.session.send_notification(
        types.ToolListChangedNotification(), related_request_id=ctx.request_id
    )
    return name


@_tool("crash", "Exit the process immediately, mid-call.", "string", "Crash")
def _crash(_: Context, __: dict[str, Any]) -> str:
    sys.stdout.flush()
    os._exit(3)


async def _list_tools(_: Context, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[tool for tool, _ in _tools.values()])


async def _call_tool(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
    known = _tools.get(params.name)
    if known is None:
        return types.CallToolResult(
            content=[types.TextContent(text=f"Unknown tool: {params.name}")], is_error=True
        )
    value = known[1](ctx, params.arguments or {})
    if not isinstance(value, (int, str)):
        value = await value
    return types.CallToolResult(
        content=[types.TextContent(text=str(value))], structured_content={"result": value}
    )


async def _set_level(_: Context, __: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def main() -> None:
    with warnings.catch_warnings():  # logging/setLevel is deprecated in the modern era; FastMCP serves it
        warnings.simplefilter("ignore")
        server: Server[Any] = Server(
            "counter",
            instructions="Counts things.",
            on_list_tools=_list_tools,
            on_call_tool=_call_tool,
            on_list_prompts=lambda ctx, params: _prompts(),
            on_list_resources=lambda ctx, params: _resources(),
            on_list_resource_templates=lambda ctx, params: _templates(),
            on_set_logging_level=_set_level,
        )
    changed = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(changed))


async def _prompts() -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[])


async def _resources() -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[])


async def _templates() -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[])


if __name__ == "__main__":
    anyio.run(main)
