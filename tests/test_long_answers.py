"""Answers of prompts, resources, tools and completions holding more items than a client can
use: each item is made a model in Python (30-80 µs), so a render of 100,000 messages held the
gateway's event loop 8 s and every other client's calls with it. A prompt of more than 1,000
messages, a read of more than 10,000 contents and a tool result of more than 10,000 blocks are
refused before their items are made models; a completion's values are cut to MCP's 100,
``hasMore`` set (before, an upstream's 900,000 reached the client; FastMCP cuts its own, so
that upstream is raw JSON-RPC)."""

from __future__ import annotations

import mcp_types as types
import pytest
from fastmcp import FastMCP
from fastmcp.prompts import Message
from fastmcp.resources import ResourceContent, ResourceResult
from fastmcp.tools import ToolResult
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent_gateway.compat.mcp import MAX_COMPLETION_VALUES
from tests.support import python_upstream, running_gateway, serving_upstream

MESSAGES = 1_000
CONTENTS = 10_000


def long_answers(renders: list[int]) -> FastMCP:
    server = FastMCP("long")

    @server.prompt
    def chat(count: str) -> list[Message]:
        renders.append(int(count))
        return [Message(f"m{n}") for n in range(int(count))]

    @server.tool
    def blocks(count: int) -> ToolResult:
        return ToolResult(content=[types.TextContent(type="text", text=f"b{n}") for n in range(count)])

    @server.resource("data://many/{count}", name="many")
    def many(count: str) -> ResourceResult:
        return ResourceResult(contents=[ResourceContent(f"c{n}") for n in range(int(count))])

    return server


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_answers_past_their_bounds_are_refused_or_cut_and_others_served(mode: str) -> None:
    renders: list[int] = []
    async with (
        serving_upstream(long_answers(renders)) as url,
        running_gateway({"upstreams": {"long": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        with pytest.raises(
            MCPError, match=f"holds 1,001 messages; the gateway takes {MESSAGES:,}"
        ) as refused:
            await client.get_prompt("long__chat", {"count": str(MESSAGES + 1)})
        assert refused.value.error.code == types.INTERNAL_ERROR
        assert len((await client.get_prompt("long__chat", {"count": str(MESSAGES)})).messages) == MESSAGES
        with pytest.raises(MCPError, match=f"holds 10,001 contents; the gateway takes {CONTENTS:,}"):
            await client.read_resource(f"data://many/{CONTENTS + 1}")
        assert len((await client.read_resource(f"data://many/{CONTENTS}")).contents) == CONTENTS
    assert renders == [MESSAGES + 1, MESSAGES]  # the refused render was the upstream's


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("upstream", ["handshake", "modern"])
async def test_a_tool_result_of_more_blocks_than_the_gateway_takes_is_refused_and_others_served(
    upstream: str, mode: str
) -> None:
    # A handshake-era upstream's result is read through the SDK's client, each block made a
    # model: 100,000 held the event loop 3.9 s. A modern HTTP upstream's call is forwarded
    # below the SDK's client, its result made a model there: the first bound missed it.
    protocol = {"protocol": "legacy"} if upstream == "handshake" else {}
    async with (
        serving_upstream(long_answers([])) as url,
        running_gateway({"upstreams": {"long": {"url": url, **protocol}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        refused = await client.call_tool("long__blocks", {"count": CONTENTS + 1})
        assert refused.is_error  # as any tool's failure upstream: a result the model can read
        assert "its answer holds 10,001 content blocks; the gateway takes 10,000" in str(refused.content[0])
        assert len((await client.call_tool("long__blocks", {"count": CONTENTS})).content) == CONTENTS


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_completion_of_more_values_than_mcp_allows_is_cut_to_them(mode: str) -> None:
    upstream = python_upstream("completions.py")
    async with (
        running_gateway({"upstreams": {"raw": upstream}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        ref = types.PromptReference(type="ref/prompt", name="raw__ask")
        completed = await client.complete(ref, {"name": "topic", "value": "v"})
    # Before, all 5,000 values came through, past MCP's "must not exceed 100 items".
    assert completed.completion.values == [f"v{n}" for n in range(MAX_COMPLETION_VALUES)]
    assert completed.completion.has_more is True
