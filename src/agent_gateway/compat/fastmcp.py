"""FastMCP's internals the gateway uses (verified against fastmcp 4.1.2): its low-level
``mcp`` server, where the gateway adds its middleware and its own handlers (FastMCP has no
public accessor for it; everything used on it is ``mcp``'s public API)."""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from mcp.server.lowlevel import Server


def lowlevel_server(server: FastMCP[Any]) -> Server[Any]:
    """The ``mcp`` low-level server FastMCP serves through."""
    lowlevel: Server[Any] = server._mcp_server  # pyright: ignore[reportPrivateUsage]
    return lowlevel
