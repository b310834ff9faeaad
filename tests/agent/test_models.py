"""The model factory's three kinds, each over its real path: OpenAI-compatible HTTP, Anthropic
HTTP, and the calling client's own model through MCP sampling (with tools, and the envelope)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.client import ConnectMode
from mcp.client.session import ClientRequestContext, SamplingFnT

from agent_gateway.config_files import parse_config
from agent_gateway.errors import ConfigError
from agent_gateway.server import Gateway
from tests.agent.model_apis import Script, ScriptedApi, Turn, anthropic_api, openai_api
from tests.agent.test_ask_agent import ask, record, text
from tests.agent.upstreams import Ran, two_upstreams
from tests.support import RunningGateway, gateway_process, running_gateway, serving

SECRET = "sk-test-0123456789abcdef"


@asynccontextmanager
async def gateway_with_model(model: dict[str, Any] | None) -> AsyncIterator[tuple[RunningGateway, Ran]]:
    agent: dict[str, Any] = {"memory": {"store": "memory"}}
    if model is not None:
        agent["model"] = model
    async with (
        two_upstreams() as (upstreams, math, _),
        running_gateway({"upstreams": upstreams, "agent": agent}) as gw,
    ):
        yield gw, math


def openai_model(base: str, **extra: Any) -> dict[str, Any]:
    """``agent.model`` for the scripted OpenAI-compatible endpoint at ``base``."""
    return {"provider": "openai", "model": "gpt-test", "base_url": f"{base}/v1", "api_key": SECRET, **extra}


async def asked_openai(
    turns: Sequence[Script], question: str, **model: Any
) -> tuple[types.CallToolResult, ScriptedApi, Ran]:
    """``question`` asked of ``ask_agent`` (a handshake-era client), the scripted OpenAI-compatible
    endpoint answering ``turns``: the result, what the endpoint was sent, what the tools ran."""
    app, api = openai_api(turns)
    async with (
        serving(app) as base,
        gateway_with_model(openai_model(base, **model)) as (gw, math),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, question)
    return result, api, math


async def test_an_openai_tool_call_whose_arguments_are_not_an_object_is_told_to_the_model() -> None:
    # JSON, but a list: one call the model is told was not run; the other call runs, and so
    # does the rest of the run.
    bad, good = ("math__add", [1, 2]), ("math__add", {"a": 2, "b": 3})
    result, api, math = await asked_openai([Turn(calls=[bad, good]), Turn(text="It is 5.")], "What is 2 + 3?")
    assert not result.is_error, text(result)
    assert math.calls == [("add", {"a": 2, "b": 3})]
    told = [m["content"] for m in api.requests[1]["messages"] if m["role"] == "tool"]
    assert any("its arguments are not a JSON object" in t for t in told), told
    assert sorted(c["is_error"] for c in record(result)["tool_calls"]) == [False, True]
    assert record(result)["usage"]["output_tokens"] > 0  # the reply's tokens counted, not lost


async def test_the_openai_provider_calls_tools_over_an_openai_compatible_endpoint() -> None:
    turns = [Turn(calls=[("math__add", {"a": 2, "b": 3})]), Turn(text="It is 5.")]
    result, api, math = await asked_openai(turns, "What is 2 + 3?", temperature=0)
    assert not result.is_error, text(result)
    assert text(result) == "It is 5."
    out = record(result)
    assert out["model"] == "gpt-test"
    assert out["usage"] == {"input_tokens": 22, "output_tokens": 14}
    assert math.calls == [("add", {"a": 2, "b": 3})]
    first, second = api.requests
    assert api.headers[0]["authorization"] == f"Bearer {SECRET}"
    assert first["model"] == "gpt-test"
    assert first["temperature"] == 0
    tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert tools["math__add"]["parameters"]["properties"] == {
        "a": {"type": "integer"},
        "b": {"type": "integer"},
    }
    assert first["messages"][0]["role"] == "system"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_0", "content": "5"}


async def test_an_openai_models_refusal_is_the_runs_answer() -> None:
    # A reply with `refusal` and no content is the model declining, in words meant for the
    # user; read as content alone, it ended the run "with an empty answer".
    declined = "I can't help with that request."
    result, _, _ = await asked_openai([Turn(refusal=declined)], "Help me with something I should not ask")
    assert not result.is_error, text(result)
    assert text(result) == declined
    assert record(result)["answer"] == declined


async def test_an_anthropic_models_refusal_without_words_ends_the_run_saying_so() -> None:
    # Anthropic's `stop_reason: refusal` with no text: the run fails saying the model declined,
    # not that it "ended the run with an empty answer".
    app, _ = anthropic_api([Turn(refusal="")])
    async with serving(app) as base:
        model = {"provider": "anthropic", "model": "claude-test", "base_url": base, "api_key": SECRET}
        async with gateway_with_model(model) as (gw, _), Client(gw.url, mode="legacy") as client:
            result = await ask(client, "Help me with something I should not ask")
    assert result.is_error
    assert text(result) == (
        "ask_agent failed: the model declined the request (its stop reason: refusal) and wrote no answer"
    )


async def test_the_anthropic_provider_calls_tools_over_the_messages_api() -> None:
    app, api = anthropic_api([Turn(calls=[("math__add", {"a": 4, "b": 5})]), Turn(text="Nine.")])
    async with serving(app) as base:
        model = {"provider": "anthropic", "model": "claude-test", "base_url": base, "api_key": SECRET}
        async with gateway_with_model(model) as (gw, math), Client(gw.url, mode="legacy") as client:
            result = await ask(client, "4 + 5?")
    assert not result.is_error, text(result)
    assert text(result) == "Nine."
    assert record(result)["model"] == "claude-test"
    assert record(result)["usage"] == {"input_tokens": 26, "output_tokens": 16}
    assert math.calls == [("add", {"a": 4, "b": 5})]
    first, second = api.requests
    # The SDK picks the header (x-api-key, or a bearer token in its newer releases).
    sent = api.headers[0]
    assert SECRET in (sent.get("x-api-key"), sent.get("authorization", "").removeprefix("Bearer "))
    assert "Math answers are exact integers." in str(first["system"])
    assert {t["name"] for t in first["tools"]} >= {"math__add", "words__upper"}
    result_block = second["messages"][-1]["content"][0]
    assert result_block["type"] == "tool_result"
    assert result_block["tool_use_id"] == "toolu_0"


async def test_a_provider_error_is_an_error_result_that_never_shows_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    refused = Turn(status=401, error=f"Incorrect API key provided: {SECRET}")
    result, _, _ = await asked_openai([refused], "Hi", max_retries=0)
    assert result.is_error
    assert "the model call failed: OpenAIAuthenticationError: Error code: 401" in text(result)
    assert "[redacted]" in text(result)
    assert SECRET not in text(result)
    assert SECRET not in str(record(result))
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_an_api_provider_without_a_key_fails_at_start_up_naming_the_field() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(
            {
                "agent": {
                    "model": {"provider": "openai", "model": "gpt-4o-mini", "api_key": "${OPENAI_API_KEY}"}
                }
            },
            {},
            source="gateway.yaml",
        )
    assert str(raised.value) == (
        "gateway.yaml: agent.model.api_key: environment variable OPENAI_API_KEY is not set "
        "(set it, or write ${OPENAI_API_KEY:-default})"
    )
    with pytest.raises(ConfigError, match=r"agent.model.api_key: provider 'anthropic' needs an API key"):
        parse_config(
            {"agent": {"model": {"provider": "anthropic", "model": "claude"}}}, {}, source="gateway.yaml"
        )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_base_url_the_provider_cannot_parse_fails_start_up_with_one_config_error(
    provider: str, tmp_path: Path
) -> None:
    # The provider's SDK parses base_url as its client is built, once the agent's libraries
    # are imported while the upstreams connect: still one ConfigError from Gateway.running,
    # raised once everything has stopped, as a name collision is (not an ExceptionGroup).
    model = {"provider": provider, "model": "m", "api_key": "k", "base_url": "http://[::1"}
    memory = {"path": str(tmp_path / "conversations.sqlite")}
    config = parse_config({"agent": {"model": model, "memory": memory}}, {}, source="gateway.yaml")
    gateway = Gateway(config)
    with pytest.raises(ConfigError, match=r"^agent\.model\.base_url: 'http://\[::1' is not a URL"):
        async with gateway.running():
            pass
    assert gateway.agent is None


SampleReply = types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData


def sampling_client(
    url: str, mode: str, replies: list[Any], seen: list[types.CreateMessageRequestParams]
) -> Client:
    """The official client, answering the gateway's sampling requests (tools allowed) with
    ``replies`` in turn, each request kept in ``seen``."""
    return Client(
        url,
        mode=mode,
        sampling_callback=sampling_script(replies, seen),
        sampling_capabilities=types.SamplingCapability(tools=types.SamplingToolsCapability()),
    )


def sampling_script(replies: list[Any], seen: list[types.CreateMessageRequestParams]) -> SamplingFnT:
    async def sample(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> SampleReply:
        seen.append(params)
        return replies.pop(0)

    return sample


def said(text_: str) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=text_), model="client-model"
    )


# "auto" speaks 2026-07-28, where the run pauses for each sampling round and the client retries.
ERAS = pytest.mark.parametrize("mode", ["legacy", "auto"])


@ERAS
@pytest.mark.parametrize("configured", [None, {"provider": "sampling"}])
async def test_the_clients_own_model_calls_tools_through_sampling_with_tools(
    configured: dict[str, Any] | None, mode: ConnectMode
) -> None:
    seen: list[types.CreateMessageRequestParams] = []
    replies = [
        types.CreateMessageResultWithTools(
            role="assistant",
            content=[
                types.ToolUseContent(id="t1", name="math__add", input={"a": 20, "b": 22}),
                types.ToolUseContent(id="t2", name="math__fail", input={}),
            ],
            model="client-model",
            stop_reason="toolUse",
        ),
        types.CreateMessageResultWithTools(
            role="assistant", content=[types.TextContent(type="text", text="42")], model="client-model"
        ),
    ]
    async with (
        gateway_with_model(configured) as (gw, math),
        sampling_client(gw.url, mode, replies, seen) as client,
    ):
        result = await ask(client, "20 + 22?")
    assert not result.is_error, text(result)
    assert text(result) == "42"
    assert record(result)["model"] == "client-model"
    assert sorted(math.calls) == [("add", {"a": 20, "b": 22}), ("fail", {})]
    first, second = seen
    assert first.tools is not None
    tools = {t.name: t for t in first.tools}
    assert tools["math__add"].input_schema["required"] == ["a", "b"]
    assert first.system_prompt is not None
    assert "[math] Math answers are exact integers." in first.system_prompt
    # Both results of the turn's calls in the one user message right after it (as the spec has
    # every tool_use answered), the failed one marked as an error for the client's model.
    call, last = second.messages[-2:]
    assert [b.type for b in call.content_as_list] == ["tool_use", "tool_use"]
    assert last.role == "user"
    added, failed = last.content_as_list
    assert isinstance(added, types.ToolResultContent)
    assert (added.tool_use_id, added.is_error) == ("t1", False)
    assert added.content == [types.TextContent(type="text", text="42")]
    assert isinstance(failed, types.ToolResultContent)
    assert (failed.tool_use_id, failed.is_error) == ("t2", True)


@ERAS
async def test_a_client_model_without_tool_support_uses_the_json_envelope_and_is_corrected(
    mode: ConnectMode,
) -> None:
    seen: list[types.CreateMessageRequestParams] = []
    replies = [
        said("Sure! I will add them."),
        said('{"type": "tool_call", "tool": "math__add", "arguments": {"a": 1, "b": 2}}'),
        said('```json\n{"type": "final", "answer": "3"}\n```'),
    ]
    async with (
        gateway_with_model(None) as (gw, math),
        Client(gw.url, mode=mode, sampling_callback=sampling_script(replies, seen)) as client,
    ):
        result = await ask(client, "1 + 2?")
    assert not result.is_error, text(result)
    assert text(result) == "3"
    assert math.calls == [("add", {"a": 1, "b": 2})]
    assert all(p.tools is None for p in seen)
    assert seen[0].system_prompt is not None
    assert '{"type": "tool_call", "tool": "<tool name>"' in seen[0].system_prompt
    assert "- math__add: Add two integers." in seen[0].system_prompt
    correction = seen[1].messages[-1]
    assert correction.role == "user"
    assert isinstance(correction.content, types.TextContent)
    assert correction.content.text.startswith(
        "Your last reply could not be used: the reply is not a single JSON object"
    )
    # The tool's result comes back as a user turn after the call, written as the envelope shows it.
    assert isinstance(seen[2].messages[-1].content, types.TextContent)
    assert seen[2].messages[-1].content.text == "Tool math__add returned:\n3"


@ERAS
async def test_a_client_model_that_never_answers_in_the_envelope_ends_the_run_with_an_error(
    mode: ConnectMode,
) -> None:
    seen: list[types.CreateMessageRequestParams] = []
    replies = [said("no"), said("[1, 2]"), said('{"type": "final"}'), said('{"type": "maybe"}')]
    async with (
        gateway_with_model(None) as (gw, _),
        Client(gw.url, mode=mode, sampling_callback=sampling_script(replies, seen)) as client,
    ):
        result = await ask(client, "Hi")
    assert result.is_error
    assert text(result) == (
        "ask_agent failed: the client's model did not answer with a valid JSON envelope after 3 corrections: "
        '"type" must be "tool_call" or "final"'
    )
    assert len(seen) == 4


async def test_a_client_that_refuses_sampling_ends_the_run_with_its_reason() -> None:
    async def refuse(context: Any, params: types.CreateMessageRequestParams) -> types.ErrorData:
        return types.ErrorData(code=types.INVALID_REQUEST, message="user rejected sampling")

    async with (
        gateway_with_model(None) as (gw, _),
        Client(gw.url, mode="legacy", sampling_callback=refuse) as client,
    ):
        result = await ask(client, "Hi")
    assert result.is_error
    assert "the client's model (sampling) failed: user rejected sampling" in text(result)


async def test_a_client_models_reply_built_to_stall_the_parser_stalls_no_one(tmp_path: Path) -> None:
    # The fence was stripped by a regular expression that took cubic time on a reply of
    # spaces: 6,000 of them held the gateway's event loop for about a minute per reply.
    stalling = said("```json" + " " * 6000 + "x")
    async with two_upstreams() as (upstreams, math, _):
        config = {"upstreams": upstreams, "agent": {"memory": {"store": "memory"}}}
        async with (
            # Its own process, as deployed: a stalled gateway must not stall the test's bounds.
            gateway_process(config, tmp_path) as base,
            Client(
                f"{base}/mcp", mode="legacy", sampling_callback=sampling_script([stalling] * 4, [])
            ) as attacker,
            Client(f"{base}/mcp", mode="legacy") as bystander,
        ):
            outcome: list[types.CallToolResult] = []

            async def attack() -> None:
                outcome.append(await attacker.call_tool("ask_agent", {"query": "Hi"}))

            async def go_about_ones_business() -> None:
                for n in range(5):
                    assert not (await bystander.call_tool("math__add", {"a": n, "b": 1})).is_error

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(attack)
                    tg.start_soon(go_about_ones_business)
    assert len(math.calls) == 5
    (result,) = outcome
    assert result.is_error
    assert "did not answer with a valid JSON envelope after 3 corrections" in text(result)


async def test_a_malformed_sampling_answer_ends_the_run_with_an_error_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The client's own bad answer (an empty result): before, an ERROR line with a pydantic
    # traceback, as for a bug of the gateway's, as often as a client cared to send one.
    accept = {"accept": "application/json, text/event-stream"}
    hello = {
        "protocolVersion": "2025-06-18",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "x", "version": "0"},
    }
    call = {"name": "ask_agent", "arguments": {"query": "Hi"}}
    results: list[dict[str, Any]] = []
    async with gateway_with_model(None) as (gw, _), httpx.AsyncClient(timeout=30) as http:
        opened = await http.post(
            gw.url, headers=accept, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        )
        headers = accept | {
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-06-18",
        }
        await http.post(
            gw.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
        async with http.stream("POST", gw.url, json=body, headers=headers) as answer:
            async for line in answer.aiter_lines():
                message = json.loads(line.removeprefix("data:")) if line.startswith("data:") else {}
                if message.get("method") == "sampling/createMessage":
                    await http.post(
                        gw.url, headers=headers, json={"jsonrpc": "2.0", "id": message["id"], "result": {}}
                    )
                elif "result" in message:
                    results.append(message["result"])
    assert results[0]["isError"]
    assert "malformed answer" in results[0]["content"][0]["text"], results
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("answer to sampling/createMessage is malformed" in r.getMessage() for r in caplog.records)


async def test_a_client_answer_past_the_body_limit_fails_its_question_at_once_saying_why() -> None:
    # Refused 413 unread, the sampling request waited out the model's timeout, then said the
    # client had not answered.
    agent = {"memory": {"store": "memory"}, "model": {"provider": "sampling", "timeout": 30}}
    async with (
        two_upstreams() as (upstreams, _, _),
        running_gateway({"upstreams": upstreams, "agent": agent, "server": {"max_body_bytes": 65536}}) as gw,
        sampling_client(gw.url, "legacy", [said("x" * 100_000)], []) as client,
    ):
        result = await ask(client, "Hi")
    assert result.is_error
    assert "the client's answer was not read: its request body is " in text(result), text(result)
    assert "the limit (server.max_body_bytes) is 65536" in text(result)
