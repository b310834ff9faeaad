"""A client against the tool search: what one search may make the gateway build and send."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from fastmcp import FastMCP
from fastmcp.tools import Tool, ToolResult
from mcp import Client

from agent_gateway.search.tools import SEARCH_TOOLS
from tests.support import running_gateway, serving_upstream
from tests.test_search_mode import found, text_of


class _Wide(Tool):
    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(content=[types.TextContent(type="text", text="ok")])


def wide_server() -> FastMCP:
    """Twenty tools of ~40 KB schemas (real ones reach 268 KB), one of 300 KB, and an echo."""
    server = FastMCP("wide")
    schema = {
        "type": "object",
        "properties": {f"f{k}": {"type": "string", "description": "x" * 1_000} for k in range(40)},
    }
    for n in range(20):
        server.add_tool(_Wide(name=f"wide_{n}", description=f"Wide record tool {n}.", parameters=schema))
    server.tool(lambda: "ok", name="huge_form", description="A huge form. " + "y" * 300_000)

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


async def test_a_search_answer_holds_the_best_definitions_within_its_bytes_and_says_what_it_left_out() -> (
    None
):
    async with (
        serving_upstream(wide_server()) as url,
        running_gateway({"upstreams": {"wide": {"url": url}}, "search": {"mode": "on"}}) as gw,
        Client(gw.url) as client,
    ):
        asked = await client.call_tool(SEARCH_TOOLS, {"query": "wide record tool", "limit": 50})
        huge = await client.call_tool(SEARCH_TOOLS, {"query": "huge form", "limit": 50})
        echoed = await client.call_tool("wide__echo", {"text": "still served"})
    assert not asked.is_error, text_of(asked)
    assert asked.structured_content is not None
    sent = len(json.dumps(asked.structured_content["tools"]))
    # 21 matched (the echo too, by its upstream's name): three definitions of ~40 KB fit, the
    # rest are said to be left out (before: all 22 sent, 0.9 MB).
    assert asked.structured_content["total"] >= 21
    assert 1 <= len(found(asked)) <= 3
    assert sent <= 128 * 1024 + 8_192  # search.tools.ANSWER_BYTES
    assert "more within your limit left out" in text_of(asked)
    # One definition past the bound is still sent: alone.
    assert found(huge) == ["wide__huge_form"]
    assert text_of(echoed) == "still served"
