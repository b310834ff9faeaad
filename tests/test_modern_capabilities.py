"""A modern upstream is told, on each request made for a client, what that client can answer:
its input requests (``InputRequiredResult``) pass to a modern client as they are, so an
upstream told more asks what the client cannot answer, where told the truth it falls back.
The upstream records the capabilities each request carries."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server

from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.support import running_gateway, serving

CAPABILITIES = types.CLIENT_CAPABILITIES_META_KEY


def recording(seen: list[tuple[str, Any]]) -> Server:
    """An upstream whose prompt ``p`` and tool ``t`` record the capabilities their request carries."""

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="p")])

    async def get_prompt(ctx: Any, params: Any) -> types.GetPromptResult:
        seen.append(("prompt", (params.meta or {}).get(CAPABILITIES)))
        text = types.TextContent(text="rendered")
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        seen.append(("tool", (params.meta or {}).get(CAPABILITIES)))
        return types.CallToolResult(content=[types.TextContent(text="called")])

    return Server(
        "up",
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", content=types.TextContent(text="hi"), model="m")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_modern_upstream_is_told_only_what_each_client_can_answer(mode: str) -> None:
    seen: list[tuple[str, Any]] = []
    async with (
        serving(recording(seen).streamable_http_app()) as base,
        running_gateway({"upstreams": {"up": {"url": f"{base}/mcp"}}}) as gw,
        Client(gw.url, mode=mode) as plain,  # no sampling, elicitation or roots callback
        Client(gw.url, mode=mode, sampling_callback=sample) as sampling,
    ):
        for client in (plain, sampling):
            await client.get_prompt("up__p")
            await client.call_tool("up__t", {})
    told = [(kind, set(capabilities or {})) for kind, capabilities in seen]
    # Before: sampling, elicitation and roots for both, the shared session's own (all it can relay).
    assert told == [("prompt", set()), ("tool", set()), ("prompt", {"sampling"}), ("tool", {"sampling"})]


@pytest.mark.parametrize(
    ("mode", "expected"), [("legacy", {"sampling"}), ("auto", set())], ids=["legacy", "auto"]
)
async def test_the_agents_calls_tell_a_modern_upstream_what_the_agent_can_answer(
    mode: str, expected: set[str]
) -> None:
    # A modern client's input rounds are not passed through the agent: an upstream's input
    # request in a run's call is answered "the agent cannot supply" (agent/calls.py). Told
    # the client could sample, the upstream asks and the call fails, where told the truth it
    # takes its fallback. A handshake-era client's are relayed to it (the SDK's callbacks).
    seen: list[tuple[str, Any]] = []
    model = ScriptedChatModel(script=[calls(call("up__t")), answer("called")])
    agent = {"memory": {"store": "memory"}}
    async with (
        serving(recording(seen).streamable_http_app()) as base,
        running_gateway(
            {"upstreams": {"up": {"url": f"{base}/mcp"}}, "agent": agent}, chat_model=model
        ) as gw,
        Client(gw.url, mode=mode, sampling_callback=sample) as sampling,
    ):
        with anyio.fail_after(20):
            result = await sampling.call_tool("ask_agent", {"query": "Call t."})
    assert not result.is_error, result.content
    assert [(kind, set(capabilities or {})) for kind, capabilities in seen] == [("tool", expected)]
