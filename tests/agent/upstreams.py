"""Inline FastMCP upstreams for the agent's tests, each recording what it ran."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

from tests.support import serving_upstream


@dataclass
class Ran:
    """The tool calls an upstream has run, in order."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def math_server(ran: Ran) -> FastMCP:
    server = FastMCP("math", instructions="Math answers are exact integers.")
    arrived: list[str] = []
    together = anyio.Event()

    @server.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.calls.append(("add", {"a": a, "b": b}))
        return a + b

    @server.tool
    async def meet(who: str) -> str:
        """Wait until two callers have arrived (proves two calls run at once)."""
        ran.calls.append(("meet", {"who": who}))
        arrived.append(who)
        if len(arrived) >= 2:
            together.set()
        with anyio.fail_after(5):
            await together.wait()
        return f"{who} met {len(arrived) - 1} other"

    @server.tool
    def fail() -> str:
        """Always fails."""
        ran.calls.append(("fail", {}))
        raise ToolError("the disk is full")

    @server.tool(annotations=types.ToolAnnotations(destructive_hint=True))
    def drop_table(table: str) -> str:
        """Delete a table and everything in it."""
        ran.calls.append(("drop_table", {"table": table}))
        return f"dropped {table}"

    return server


def words_server(ran: Ran) -> FastMCP:
    server = FastMCP("words", instructions="Words are returned in upper case.")

    @server.tool
    def upper(text: str) -> str:
        """Upper-case a text."""
        ran.calls.append(("upper", {"text": text}))
        return text.upper()

    @server.tool
    def ask_agent(query: str) -> str:
        """A tool that would take the gateway's own agent's name."""
        return query

    return server


@asynccontextmanager
async def two_upstreams() -> AsyncIterator[tuple[dict[str, Any], Ran, Ran]]:
    """Both servers over loopback HTTP; yields the ``upstreams:`` config and their records."""
    math, words = Ran(), Ran()
    async with (
        serving_upstream(math_server(math)) as math_url,
        serving_upstream(words_server(words)) as words_url,
    ):
        yield {"math": {"url": math_url}, "words": {"url": words_url, "prefix": True}}, math, words
