"""A stdio upstream for tests: counts calls, can change its tool list, can crash on demand."""

from __future__ import annotations

import os
import sys

from fastmcp import Context, FastMCP

server = FastMCP("counter", instructions="Counts things.")
calls = {"n": 0}


@server.tool
def increment(by: int = 1) -> int:
    """Add ``by`` to the counter and return it."""
    calls["n"] += by
    return calls["n"]


@server.tool
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool
async def add_tool(name: str, ctx: Context) -> str:
    """Register a new tool called ``name`` (announces tools/list_changed)."""

    def extra() -> str:
        return name

    server.tool(extra, name=name, description=f"added at run time: {name}")
    await ctx.send_notification(__import__("mcp_types").ToolListChangedNotification())
    return name


@server.tool
def crash() -> str:
    """Exit the process immediately, mid-call."""
    sys.stdout.flush()
    os._exit(3)


if __name__ == "__main__":
    server.run(show_banner=False, log_level="WARNING")
