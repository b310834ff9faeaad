"""A client's own ``_meta`` keys on a request (``meta_keys``: prefixed, the prefix nobody's)
reach the upstream as they are, on every method that is forwarded (``tools/call``,
``prompts/get``, ``resources/read``, ``completion/complete``), in both eras and both ways to
an HTTP upstream (the SDK's client, and the modern era's forwarder below it); the others
never do: the protocol's, the gateway's (a client cannot speak for another's session), and
bare names the SDK or FastMCP act on."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server

from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.support import running_gateway, serving

KEY = "example.com/request-key"
SESSION_KEY = "io.agent-gateway/session-id"
IDE_KEY = "claudecode/toolUseId"
NOT_THE_CLIENTS = {
    SESSION_KEY: "someone-elses",
    "IO.Agent-Gateway/session-id": "someone-elses",
    "io.modelcontextprotocol/made-up": "x",
    "dev.mcp/x": "x",
    "modelcontextprotocol.io/related-task": "x",
    # Bare names the SDK or FastMCP act on: progress aimed at another's call (the SDK writes
    # progress_token upstream as progressToken), a tool version never listed, an identity.
    # (The trace context is carried on by the gateway itself: tests/test_telemetry.py.)
    "progressToken": "chosen-by-client",
    "progress_token": "chosen-by-client",
    "fastmcp": {"version": "1.0"},
    "client_id": "admin",
    " example.com/spaced": "x",
}
SENT = {KEY: {"v": [1, 2]}, IDE_KEY: "toolu_01"} | NOT_THE_CLIENTS


def recording_server(seen: dict[str, dict[str, Any]]) -> Server:
    """Answers each method, recording the ``_meta`` each request arrived with."""

    def record(method: str, params: Any) -> None:
        seen[method] = dict(params.meta or {})

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        record("tools/call", params)
        return types.CallToolResult(content=[types.TextContent(text="ok")])

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        record("prompts/get", params)
        return types.GetPromptResult(messages=[])

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="p")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        record("resources/read", params)
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="r")])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri="mem://r", name="r")])

    async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        record("completion/complete", params)
        return types.CompleteResult(completion=types.Completion(values=[]))

    return Server(
        "rec",
        on_call_tool=call_tool,
        on_list_tools=list_tools,
        on_get_prompt=get_prompt,
        on_list_prompts=list_prompts,
        on_read_resource=read_resource,
        on_list_resources=list_resources,
        on_completion=complete,
    )


@pytest.mark.parametrize("upstream", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_clients_own_meta_keys_reach_the_upstream_on_every_forwarded_method(
    mode: str, upstream: str
) -> None:
    seen: dict[str, dict[str, Any]] = {}
    config = {"upstreams": {"rec": {"protocol": upstream}}, "agent": {"enabled": False}}
    async with serving(recording_server(seen).streamable_http_app()) as base:
        config["upstreams"]["rec"]["url"] = f"{base}/mcp"
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:
            await client.session.call_tool("rec__t", {}, meta=SENT)  # pyright: ignore[reportArgumentType]
            await client.session.get_prompt("rec__p", {}, meta=SENT)  # pyright: ignore[reportArgumentType]
            await client.session.read_resource("mem://r", meta=SENT)  # pyright: ignore[reportArgumentType]
            ref = types.PromptReference(name="rec__p")
            argument = types.CompletionArgument(name="a", value="x")
            params = types.CompleteRequestParams.model_validate(
                {"ref": ref.model_dump(by_alias=True), "argument": argument.model_dump(), "_meta": SENT}
            )
            await client.session.send_request(types.CompleteRequest(params=params), types.CompleteResult)
    assert sorted(seen) == ["completion/complete", "prompts/get", "resources/read", "tools/call"]
    for method, meta in seen.items():
        assert (meta[KEY], meta[IDE_KEY]) == ({"v": [1, 2]}, "toolu_01"), method
        assert meta[SESSION_KEY] not in ("someone-elses", None), method  # the gateway's own
        # Absent, or the gateway's own value.
        assert [k for k, v in NOT_THE_CLIENTS.items() if meta.get(k) == v] == [], method


async def test_the_agents_calls_do_not_carry_the_meta_keys_of_the_clients_ask_agent() -> None:
    # They belong to the client's request (an IDE's id for its own tool call, say), not to
    # the calls the agent makes for it.
    seen: dict[str, dict[str, Any]] = {}
    model = ScriptedChatModel(script=[calls(call("rec__t")), answer("done")])
    async with serving(recording_server(seen).streamable_http_app()) as base:
        config = {"upstreams": {"rec": {"url": f"{base}/mcp"}}}
        async with running_gateway(config, chat_model=model) as gw, Client(gw.url, mode="legacy") as client:
            result = await client.session.call_tool("ask_agent", {"query": "go"}, meta=SENT)  # pyright: ignore[reportArgumentType]
    assert not result.is_error, result
    assert KEY not in seen["tools/call"]
    assert SESSION_KEY in seen["tools/call"]
