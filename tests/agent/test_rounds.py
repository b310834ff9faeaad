"""A modern (2026-07-28) client's run, round by round: each question to the client pauses the
run (``InputRequiredResult``), and the client's retry with the answers resumes it in place."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import BOUND, agent_gateway, record, text
from tests.agent.test_models import gateway_with_model
from tests.agent.upstreams import two_upstreams
from tests.support import running_gateway

WITH_TOOLS = types.SamplingCapability(tools=types.SamplingToolsCapability())
Round = types.CallToolResult | types.InputRequiredResult


async def call_round(
    client: Client,
    arguments: dict[str, Any],
    answers: Mapping[str, types.InputResponse] | None = None,
    state: str | None = None,
) -> Round:
    """One ``tools/call`` of ``ask_agent``, the pause returned as it is instead of answered."""
    with anyio.fail_after(BOUND):
        result = await client.session.call_tool(
            "ask_agent",
            arguments,
            input_responses=dict(answers) if answers is not None else None,
            request_state=state,
            allow_input_required=True,
        )
    assert isinstance(result, types.CallToolResult | types.InputRequiredResult)
    return result


async def unused(context: Any, params: Any) -> Any:
    """A callback that only declares the capability: these tests answer each round themselves."""
    raise AssertionError("the test drives the rounds")


def paused(result: Round) -> types.InputRequiredResult:
    assert isinstance(result, types.InputRequiredResult), result
    assert result.input_requests is not None
    assert result.request_state is not None
    return result


def finished(result: Round) -> types.CallToolResult:
    assert isinstance(result, types.CallToolResult), result
    return result


def sampled(*blocks: types.SamplingMessageContentBlock) -> types.CreateMessageResultWithTools:
    return types.CreateMessageResultWithTools(role="assistant", content=list(blocks), model="client-model")


async def test_a_modern_run_pauses_for_each_model_turn_and_resumes_where_it_stopped() -> None:
    question = {"query": "20 + 22?"}
    async with (
        gateway_with_model(None) as (gw, math),
        Client(gw.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS) as client,
    ):
        first = paused(await call_round(client, question))
        assert list(first.input_requests or {}) == ["model"]
        asked = first.input_requests["model"]  # type: ignore[index]
        assert isinstance(asked, types.CreateMessageRequest)
        assert asked.params.tools is not None
        assert math.calls == []

        use = types.ToolUseContent(id="t1", name="math__add", input={"a": 20, "b": 22})
        second = paused(await call_round(client, question, {"model": sampled(use)}, first.request_state))
        # The tool ran between the two pauses, and its result is in the second question.
        assert math.calls == [("add", {"a": 20, "b": 22})]
        result_block = second.input_requests["model"].params.messages[-1].content_as_list[0]  # type: ignore[index, union-attr]
        assert isinstance(result_block, types.ToolResultContent)
        assert result_block.tool_use_id == "t1"

        done = finished(
            await call_round(
                client,
                question,
                {"model": sampled(types.TextContent(type="text", text="42"))},
                second.request_state,
            )
        )
        assert not done.is_error, text(done)
        assert text(done) == "42"
        out = record(done)
        assert (out["steps"], len(out["tool_calls"]), out["model"]) == (2, 1, "client-model")

        # An answer to a pause that was already answered resumes nothing.
        stale = finished(
            await call_round(
                client,
                question,
                {"model": sampled(types.TextContent(type="text", text="0"))},
                first.request_state,
            )
        )
    assert stale.is_error
    assert "is no longer waiting for this answer" in text(stale)
    assert math.calls == [("add", {"a": 20, "b": 22})]


async def test_a_request_state_changed_by_the_client_is_refused() -> None:
    question = {"query": "Hi"}
    async with (
        gateway_with_model(None) as (gw, _),
        Client(gw.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS) as client,
    ):
        first = paused(await call_round(client, question))
        reply = {"model": sampled(types.TextContent(type="text", text="Hello"))}
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await call_round(client, question, reply, (first.request_state or "") + "x")
        # Sealed for this call's arguments: another query cannot take over the pause.
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await call_round(client, {"query": "Other"}, reply, first.request_state)
        done = finished(await call_round(client, question, reply, first.request_state))
    assert text(done) == "Hello"


async def test_a_modern_client_approves_every_call_of_a_turn_in_one_round_before_any_runs(
    tmp_path: Path,
) -> None:
    model = ScriptedChatModel(
        script=[
            calls(call("math__add", a=1, b=2)),
            calls(call("math__drop_table", table="a"), call("math__drop_table", table="b")),
            answer("Dropped b."),
        ]
    )
    question = {"query": "Add, then drop a and b."}
    async with (
        agent_gateway(model, tmp_path) as (gw, math, _),
        Client(gw.url, mode="auto", elicitation_callback=unused) as client,
    ):
        first = paused(await call_round(client, question))
        # The first turn's add needed no approval and ran; neither drop has run yet.
        assert math.names() == ["add"]
        assert sorted(first.input_requests or {}) == ["approve-0", "approve-1"]
        messages = [r.params.message for r in (first.input_requests or {}).values()]  # type: ignore[union-attr]
        assert ['"table": "a"' in m for m in messages] == [True, False]
        answers: types.InputResponses = {
            "approve-0": types.ElicitResult(action="decline"),
            "approve-1": types.ElicitResult(action="accept", content={"approve": True}),
        }
        done = finished(await call_round(client, question, answers, first.request_state))
    assert not done.is_error, text(done)
    # Resumed in the tools node: the first turn's add did not run again.
    assert math.calls == [("add", {"a": 1, "b": 2}), ("drop_table", {"table": "b"})]
    assert [c["is_error"] for c in record(done)["tool_calls"]] == [False, True, False]
    assert record(done)["steps"] == 3


@pytest.mark.parametrize("keys", [True, False])
async def test_a_paused_run_resumes_after_a_gateway_restart_when_the_state_key_is_configured(
    tmp_path: Path, keys: bool
) -> None:
    question = {"query": "Hi"}
    reply = {"model": sampled(types.TextContent(type="text", text="Hello again"))}
    async with two_upstreams() as (upstreams, _, _):
        config = {
            "upstreams": upstreams,
            "server": {"state_keys": ["k" * 32] if keys else []},
            "agent": {"memory": {"path": str(tmp_path / "conversations.sqlite")}},
        }
        async with (
            running_gateway(config) as before,
            Client(
                before.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS
            ) as client,
        ):
            first = paused(await call_round(client, question))
        async with (
            running_gateway(config) as after,
            Client(
                after.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS
            ) as client,
        ):
            if not keys:  # a per-process key: the new process cannot open the old state
                with pytest.raises(MCPError, match="Invalid or expired requestState"):
                    await call_round(client, question, reply, first.request_state)
                return
            done = finished(await call_round(client, question, reply, first.request_state))
    assert text(done) == "Hello again"


async def test_a_new_question_replaces_a_pause_that_was_never_answered() -> None:
    one, two = {"query": "One?", "conversation_id": "c"}, {"query": "Two?", "conversation_id": "c"}
    reply = {"model": sampled(types.TextContent(type="text", text="Both."))}
    async with (
        gateway_with_model(None) as (gw, _),
        Client(gw.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS) as client,
    ):
        abandoned = paused(await call_round(client, one))
        second = paused(await call_round(client, two))
        stale = finished(await call_round(client, one, reply, abandoned.request_state))
        done = finished(await call_round(client, two, reply, second.request_state))
    # The unanswered question stays in the thread, joined with the new one in one user turn.
    messages = second.input_requests["model"].params.messages  # type: ignore[index, union-attr]
    assert [(m.role, [b.text for b in m.content_as_list]) for m in messages] == [("user", ["One?", "Two?"])]  # type: ignore[union-attr]
    assert stale.is_error
    assert "is no longer waiting for this answer" in text(stale)
    assert text(done) == "Both."


async def test_a_retry_without_the_answers_ends_the_run_with_a_clear_error() -> None:
    question = {"query": "Hi"}
    async with (
        gateway_with_model(None) as (gw, _),
        Client(gw.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS) as client,
    ):
        first = paused(await call_round(client, question))
        done = finished(await call_round(client, question, None, first.request_state))
    assert done.is_error
    assert "the client's retry carried no answer to sampling/createMessage" in text(done)


async def test_a_modern_runs_rounds_are_one_run_against_the_clients_runs_per_minute() -> None:
    question = {"query": "20 + 22?"}
    budget = {"policies": {"default": {"agent": {"runs_per_minute": 1}}}}
    async with (
        two_upstreams() as (upstreams, math, _),
        running_gateway(
            {"upstreams": upstreams, "agent": {"memory": {"store": "memory"}}, "auth": budget}
        ) as gw,
        Client(gw.url, mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS) as client,
    ):
        first = paused(await call_round(client, question))
        use = types.ToolUseContent(id="t1", name="math__add", input={"a": 20, "b": 22})
        second = paused(await call_round(client, question, {"model": sampled(use)}, first.request_state))
        reply = {"model": sampled(types.TextContent(type="text", text="42"))}
        done = finished(await call_round(client, question, reply, second.request_state))
        again = finished(await call_round(client, {"query": "And 1 + 1?"}))  # a second run: over
    assert not done.is_error, text(done)
    assert math.calls == [("add", {"a": 20, "b": 22})]
    assert again.is_error
    assert "agent runs over the limit (agent.runs_per_minute)" in text(again)


async def test_a_modern_clients_approval_after_the_approval_timeout_runs_nothing(tmp_path: Path) -> None:
    # As a handshake-era client's late answer: the timeout has passed (1 ms: any retry is
    # later than that), so the approval counts for nothing and the tool is not run.
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="a")), answer("Not dropped.")])
    question = {"query": "Drop a."}
    async with (
        agent_gateway(model, tmp_path, approval_timeout=0.001) as (gw, math, _),
        Client(gw.url, mode="auto", elicitation_callback=unused) as client,
    ):
        first = paused(await call_round(client, question))
        late: types.InputResponses = {
            "approve-0": types.ElicitResult(action="accept", content={"approve": True})
        }
        done = finished(await call_round(client, question, late, first.request_state))
    assert not done.is_error, text(done)
    assert math.calls == []
    assert [c["is_error"] for c in record(done)["tool_calls"]] == [True]
    assert "no approval came within 0.001s" in model.seen[-1][-1].content  # what the model was told


@asynccontextmanager
async def modern_at(address: str, url: str) -> AsyncIterator[Client]:
    """A modern client of the gateway at ``url``, connecting from ``address``, that answers
    approvals itself (``call_round``)."""
    transport = httpx2.AsyncHTTPTransport(local_address=address)
    async with (
        httpx2.AsyncClient(transport=transport, timeout=BOUND) as http,
        Client(
            streamable_http_client(url, http_client=http), mode="auto", elicitation_callback=unused
        ) as client,
    ):
        yield client


async def test_an_anonymous_client_at_another_address_cannot_answer_or_read_a_paused_run(
    tmp_path: Path,
) -> None:
    # The SDK binds a requestState to an authenticated client only: another address's client
    # holding a paused run's state approved its destructive call and read its answer.
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="prod")), answer("Dropped prod.")])
    question = {"query": "Drop prod.", "conversation_id": "ops"}
    approve: types.InputResponses = {
        "approve-0": types.ElicitResult(action="accept", content={"approve": True})
    }
    async with agent_gateway(model, tmp_path) as (gw, math, _):
        async with modern_at("127.0.0.2", gw.url) as owner:
            first = paused(await call_round(owner, question))
        async with modern_at("127.0.0.3", gw.url) as other:
            taken = finished(await call_round(other, question, approve, first.request_state))
        assert math.calls == []  # the upstream never saw the call
        async with modern_at("127.0.0.2", gw.url) as owner:
            done = finished(await call_round(owner, question, approve, first.request_state))
    assert taken.is_error
    assert "another client's run" in text(taken)
    assert "Dropped prod." not in str(taken.structured_content)
    assert text(done) == "Dropped prod."
    assert math.calls == [("drop_table", {"table": "prod"})]
