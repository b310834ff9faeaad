"""A stdio upstream for tests: counts calls, can change its tool list, can crash on demand.

Written on the SDK's low-level server (``lowlevel_tools.py``), not FastMCP: the suite starts
this server ~170 times, and FastMCP's cost each start 1.4-1.6 s of CPU against ~0.8 s here.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types as types

# A sibling module: this file runs as a script, its directory first on sys.path.
from lowlevel_tools import Context, Tools, serve_stdio

tools = Tools()
calls = {"n": 0}


@tools.tool(
    "increment",
    "Add ``by`` to the counter and return it.",
    "integer",
    {"by": {"type": "integer", "default": 1}},
)
def _increment(_: Context, arguments: dict[str, Any]) -> int:
    calls["n"] += arguments.get("by", 1)
    return calls["n"]


@tools.tool("pid", "This server's process id.", "integer")
def _pid(_: Context, __: dict[str, Any]) -> int:
    return os.getpid()


@tools.tool(
    "add_tool",
    "Register a new tool called ``name`` (announces tools/list_changed).",
    "string",
    {"name": {"type": "string"}},
)
async def _add_tool(ctx: Context, arguments: dict[str, Any]) -> str:
    name = str(arguments["name"])
    tools.tool(name, f"added at run time: {name}", "string")(lambda _ctx, _args: name)
    # On the call's own stream: a modern (2026-07-28) session drops a notification related to
    # no request, as FastMCP's Context.send_notification knows.
    await ctx.session.send_notification(
        types.ToolListChangedNotification(), related_request_id=ctx.request_id
    )
    return name


@tools.tool("crash", "Exit the process immediately, mid-call.", "string")
def _crash(_: Context, __: dict[str, Any]) -> str:
    sys.stdout.flush()
    os._exit(3)


if __name__ == "__main__":
    anyio.run(serve_stdio, tools.server("counter", instructions="Counts things."))
