"""ask_agent over real upstreams with a scripted model: the graph, tools, limits, failures, memory."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from jsonschema import Draft202012Validator
from langchain_core.messages import SystemMessage, ToolMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agent_gateway.access import OPERATOR
from agent_gateway.agent.threads import anonymous_space
from agent_gateway.agent.tool import MAX_QUERY_CHARS, AgentTool
from agent_gateway.config_files import parse_config
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.upstreams import Ran, two_upstreams
from tests.support import RunningGateway, python_upstream, running_gateway

BOUND = 20.0

LOCAL = anonymous_space("anonymous@127.0.0.1")
"""The thread space of the tests' anonymous clients (all on loopback's 127.0.0.1)."""


@asynccontextmanager
async def agent_gateway(
    model: ScriptedChatModel, tmp_path: Path, **agent: Any
) -> AsyncIterator[tuple[RunningGateway, Ran, Ran]]:
    memory = {"store": "sqlite", "path": str(tmp_path / "conversations.sqlite")}
    async with two_upstreams() as (upstreams, math, words):
        config = {"upstreams": upstreams, "agent": {"memory": memory, **agent}}
        async with running_gateway(config, chat_model=model) as gw:
            yield gw, math, words


async def ask(client: Client, query: str, **extra: Any) -> types.CallToolResult:
    with anyio.fail_after(BOUND):
        return await client.call_tool("ask_agent", {"query": query, **extra})


def record(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None
    return result.structured_content


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_ask_agent_is_listed_with_its_input_schema_and_what_it_can_reach(tmp_path: Path) -> None:
    async with (
        agent_gateway(ScriptedChatModel(), tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        tools = {t.name: t for t in (await client.list_tools()).tools}
    tool = tools["ask_agent"]
    assert tool.input_schema["required"] == ["query"]
    assert set(tool.input_schema["properties"]) == {"query", "conversation_id", "context"}
    assert tool.description is not None
    # Upstreams by name, without counts: a new tool must not change the description (and
    # tell every client the list changed).
    assert "It can reach: math, words." in tool.description  # words__ask_agent is just another tool
    assert "words__ask_agent" in tools


async def test_a_run_calls_tools_of_two_upstreams_in_turn_and_answers_with_the_record(tmp_path: Path) -> None:
    model = ScriptedChatModel(
        script=[
            calls(call("math__add", a=2, b=3)),
            calls(call("words__upper", text="five")),
            answer("2 + 3 is FIVE."),
        ]
    )
    async with agent_gateway(model, tmp_path) as (gw, math, words), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Add 2 and 3, then shout it.")
        schema = {t.name: t for t in (await client.list_tools()).tools}["ask_agent"].output_schema
    assert not result.is_error, text(result)
    assert text(result) == "2 + 3 is FIVE."
    out = record(result)
    # The published output schema declares every field of the record, and the record holds it.
    assert schema is not None
    assert set(schema["properties"]) == set(out)
    Draft202012Validator(schema).validate(out)
    assert out["answer"] == "2 + 3 is FIVE."
    assert out["steps"] == 3
    assert [(c["name"], c["arguments"], c["is_error"]) for c in out["tool_calls"]] == [
        ("math__add", {"a": 2, "b": 3}, False),
        ("words__upper", {"text": "five"}, False),
    ]
    assert all(c["duration_ms"] > 0 for c in out["tool_calls"])
    assert out["usage"] == {"input_tokens": 30, "output_tokens": 15}
    assert out["model"] == "scripted"
    assert out["started_at"] <= out["ended_at"]
    assert math.calls == [("add", {"a": 2, "b": 3})]
    assert words.calls == [("upper", {"text": "five"})]
    # The model saw each tool's result, and a system prompt with each upstream's instructions.
    results = [m.content for m in model.seen[2] if isinstance(m, ToolMessage)]
    assert results == ["5", "FIVE"]
    system = model.seen[0][0]
    assert isinstance(system, SystemMessage)
    assert "[math] Math answers are exact integers." in system.text
    assert "[words] Words are returned in upper case." in system.text
    # Tools reach the model with their JSON schema intact, minus the agent itself.
    specs = {t["function"]["name"]: t["function"] for t in model.tools}
    assert specs["math__add"]["parameters"]["required"] == ["a", "b"]
    assert specs["math__add"]["description"] == "Add two integers."
    assert "ask_agent" not in specs


async def test_independent_tool_calls_of_one_turn_run_at_the_same_time(tmp_path: Path) -> None:
    # Each meet call waits for the other: run one after the other, both would time out.
    model = ScriptedChatModel(
        script=[calls(call("math__meet", who="ann"), call("math__meet", who="bob")), answer("They met.")]
    )
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Have ann and bob meet.")
    assert not result.is_error, text(result)
    assert [c["is_error"] for c in record(result)["tool_calls"]] == [False, False]
    assert sorted(math.names()) == ["meet", "meet"]
    seen = sorted(m.text for m in model.seen[1] if isinstance(m, ToolMessage))
    assert seen == ["ann met 1 other", "bob met 1 other"]


async def test_the_step_limit_ends_the_run_with_an_error_and_the_partial_record(tmp_path: Path) -> None:
    model = ScriptedChatModel(respond=lambda _: calls(call("math__add", a=1, b=1)))
    async with (
        agent_gateway(model, tmp_path, max_steps=3) as (gw, math, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Keep adding.")
        status = gw.gateway.status()
    assert result.is_error
    assert "step limit (3 model turns)" in text(result)
    out = record(result)
    assert out["steps"] == 3
    assert len(out["tool_calls"]) == 2
    assert out["answer"] is None
    assert "step limit" in out["error"]
    assert len(math.calls) == 2
    assert status["pending_calls"] == 0


async def test_a_model_that_raises_ends_the_run_with_its_error_and_the_partial_record(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[calls(call("math__add", a=1, b=2)), RuntimeError("provider exploded")])
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Add.")
        # The gateway goes on serving: the next run answers.
        model.script = [answer("fine")]
        again = await ask(client, "Again.")
    assert result.is_error
    assert "the model call failed: RuntimeError: provider exploded" in text(result)
    out = record(result)
    assert out["steps"] == 1
    assert [c["name"] for c in out["tool_calls"]] == ["math__add"]
    assert out["usage"] == {"input_tokens": 10, "output_tokens": 5}
    assert not again.is_error
    assert text(again) == "fine"


async def test_failing_unknown_and_invalid_tool_calls_reach_the_model_as_errors(tmp_path: Path) -> None:
    model = ScriptedChatModel(
        script=[
            calls(call("math__fail"), call("math__nope"), call("math__add", a="two", b=1)),
            answer("Nothing worked."),
        ]
    )
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Try things.")
    assert not result.is_error, text(result)
    out = record(result)
    assert [(c["name"], c["is_error"]) for c in out["tool_calls"]] == [
        ("math__fail", True),
        ("math__nope", True),
        ("math__add", True),
    ]
    seen = {m.name: m for m in model.seen[1] if isinstance(m, ToolMessage)}
    assert "the disk is full" in seen["math__fail"].text
    assert "Unknown tool 'math__nope'" in seen["math__nope"].text
    assert "Invalid arguments for tool 'math__add'" in seen["math__add"].text
    assert all(m.status == "error" for m in seen.values())
    assert math.names() == ["fail"]  # invalid arguments never left the gateway


async def test_an_empty_or_malformed_request_gets_a_clear_error(tmp_path: Path) -> None:
    async with (
        agent_gateway(ScriptedChatModel(), tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        empty = await ask(client, "   ")
        extra = await ask(client, "hi", colour="red")
        bad_context = await ask(client, "hi", context="not an object")
    assert empty.is_error
    assert text(empty) == "Invalid arguments for ask_agent: query: must not be empty"
    assert extra.is_error
    assert "'colour' was unexpected" in text(extra)
    assert bad_context.is_error
    assert "context: 'not an object' is not of type 'object'" in text(bad_context)


async def test_an_upstream_tool_cannot_take_the_agents_name(tmp_path: Path) -> None:
    async with (
        two_upstreams() as (upstreams, _, _),
        running_gateway(
            {"upstreams": {"words": {**upstreams["words"], "prefix": False}}}, chat_model=ScriptedChatModel()
        ) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        tools = [t.name for t in (await client.list_tools()).tools]
    assert sorted(tools) == ["ask_agent", "upper"]
    assert gw.gateway.catalog.snapshot.tools.keys() == {"upper"}


@pytest.mark.parametrize("store", ["sqlite", "memory"])
async def test_a_conversation_continues_within_a_session_and_by_its_id(tmp_path: Path, store: str) -> None:
    model = ScriptedChatModel(script=[answer("Noted: blue."), answer("Blue."), answer("Blue, still.")])
    async with agent_gateway(
        model, tmp_path, memory={"store": store, "path": str(tmp_path / "c.sqlite")}
    ) as (
        gw,
        _,
        _,
    ):
        async with Client(gw.url, mode="legacy") as client:
            first = await ask(client, "My colour is blue.")
            second = await ask(client, "What is my colour?")
        async with Client(gw.url, mode="legacy") as other:
            third = await ask(other, "And now?", conversation_id=record(first)["thread_id"])
    assert record(first)["thread_id"] == record(second)["thread_id"] == record(third)["thread_id"]
    assert _human_turns(model, 1) == ["My colour is blue.", "What is my colour?"]
    assert _human_turns(model, 2) == ["My colour is blue.", "What is my colour?", "And now?"]


@asynccontextmanager
async def at(address: str, url: str) -> AsyncIterator[Client]:
    """A handshake-era client of the gateway at ``url``, connecting from ``address``."""
    transport = httpx2.AsyncHTTPTransport(local_address=address)
    async with (
        httpx2.AsyncClient(transport=transport, timeout=BOUND) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        yield client


async def test_anonymous_clients_at_two_addresses_cannot_open_each_others_conversations(
    tmp_path: Path,
) -> None:
    # Every anonymous client's threads were in one space: a client at another address read
    # (its model was sent) and wrote the conversation by naming it, or its thread_id.
    model = ScriptedChatModel(
        script=[answer("Noted."), answer("Nothing to recall."), answer("Again nothing.")]
    )
    async with agent_gateway(model, tmp_path) as (gw, _, _):
        async with at("127.0.0.2", gw.url) as victim:
            told = await ask(victim, "The password is HUNTER2.", conversation_id="plans")
        async with at("127.0.0.3", gw.url) as other:
            by_name = await ask(other, "What is the password?", conversation_id="plans")
            by_id = await ask(other, "And now?", conversation_id=record(told)["thread_id"])
    assert record(told)["thread_id"] != record(by_name)["thread_id"]
    assert record(by_id)["thread_id"].startswith(record(by_name)["thread_id"].split(":")[0])
    for seen in model.seen[1:]:  # what the other client's runs sent the model
        assert not any("HUNTER2" in str(message.content) for message in seen)


async def test_a_query_or_context_longer_than_a_context_window_is_refused_before_any_run(
    tmp_path: Path,
) -> None:
    # Unbounded, 3.5 MB queries grew the gateway by 1 GB, and its store by 350 MB, in 30 runs.
    model = ScriptedChatModel(script=[answer("Fits.")])
    long = "word " * (MAX_QUERY_CHARS // 5) + "!"
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        too_long = await ask(client, long, conversation_id="big")
        too_much = await ask(client, "Look.", conversation_id="big", context={"notes": long})
        fits = await ask(client, long[:-2], conversation_id="small")
    assert too_long.is_error
    assert too_much.is_error
    assert "Invalid arguments for ask_agent: query: " in text(too_long)
    assert f"context: {len(long) + 13:,} characters of JSON, more than {MAX_QUERY_CHARS:,}" in text(too_much)
    assert not fits.is_error, text(fits)
    assert len(model.seen) == 1  # only the run that fits reached the model
    with sqlite3.connect(tmp_path / "conversations.sqlite") as db:
        threads = {row[0] for row in db.execute("SELECT DISTINCT thread_id FROM checkpoints")}
    assert threads == {f"{LOCAL}small"}


async def test_a_conversation_survives_a_gateway_restart(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[answer("Noted: 42."), answer("It was 42.")])
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        first = await ask(client, "Remember 42.", conversation_id="project-x")
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        second = await ask(client, "What was the number?", conversation_id="project-x")
    assert record(first)["thread_id"] == record(second)["thread_id"] == f"{LOCAL}project-x"
    assert [m.text for m in model.seen[1][1:]] == ["Remember 42.", "Noted: 42.", "What was the number?"]


def _human_turns(model: ScriptedChatModel, call_index: int) -> list[str]:
    return [m.text for m in model.seen[call_index] if m.type == "human"]


async def test_a_run_after_a_catalog_change_is_offered_the_new_tools(tmp_path: Path) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    model = ScriptedChatModel(script=[answer("first"), calls(call("counter__fresh")), answer("done")])
    config = {
        "upstreams": {"counter": python_upstream("counter.py")},
        "agent": {"memory": {"store": "memory"}},
    }
    async with (
        running_gateway(config, chat_model=model) as gw,
        Client(gw.url, mode="legacy", message_handler=on_message) as client,
    ):
        await ask(client, "Before.")
        before = {t["function"]["name"] for t in model.tools}
        await client.call_tool("counter__add_tool", {"name": "fresh"})
        with anyio.fail_after(BOUND):
            await changed.wait()
        described = {t.name: t.description for t in (await client.list_tools()).tools}["ask_agent"]
        result = await ask(client, "After.")
    assert "counter__fresh" not in before
    assert "counter__fresh" in {t["function"]["name"] for t in model.tools}
    assert "It can reach: counter." in str(described)
    assert not result.is_error, text(result)
    assert record(result)["tool_calls"][0] | {"duration_ms": 0} == {
        "name": "counter__fresh",
        "arguments": {},
        "is_error": False,
        "duration_ms": 0,
    }


async def test_agent_tools_globs_limit_what_the_model_may_call(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[calls(call("words__upper", text="x")), answer("no")])
    async with (
        agent_gateway(
            model, tmp_path, tools={"include": ["math__*", "words__*"], "exclude": ["words__*"]}
        ) as (
            gw,
            _,
            words,
        ),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Shout x.")
    assert {t["function"]["name"] for t in model.tools} == {
        "math__add",
        "math__meet",
        "math__fail",
        "math__drop_table",
    }
    assert record(result)["tool_calls"][0]["is_error"] is True
    assert words.calls == []


async def test_a_modern_client_gets_a_fresh_thread_per_request_and_continues_by_its_id(
    tmp_path: Path,
) -> None:
    model = ScriptedChatModel(script=[answer("one"), answer("two"), answer("three")])
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="auto") as client:
        first = await ask(client, "First.")
        second = await ask(client, "Second.")
        third = await ask(client, "Third.", conversation_id=record(first)["thread_id"])
    assert not first.is_error, text(first)
    assert record(first)["thread_id"] != record(second)["thread_id"]
    assert record(third)["thread_id"] == record(first)["thread_id"]
    assert _human_turns(model, 1) == ["Second."]
    assert _human_turns(model, 2) == ["First.", "Third."]


async def test_history_out_of_the_context_window_is_dropped_from_the_stored_thread(tmp_path: Path) -> None:
    filler = " ".join(["word"] * 60)
    model = ScriptedChatModel(respond=lambda _: answer(f"ok {filler}"))
    async with (
        agent_gateway(model, tmp_path, max_context_tokens=300) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        for n in range(8):
            result = await ask(client, f"turn {n} {filler}", conversation_id="long")
            assert not result.is_error, text(result)
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "conversations.sqlite")) as saver:
        stored = await saver.aget_tuple({"configurable": {"thread_id": f"{LOCAL}long"}})
        # Only the latest checkpoint is kept: the file does not grow with every step.
        async with saver.conn.execute(
            "SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (f"{LOCAL}long",)
        ) as rows:
            assert await rows.fetchone() == (1,)
    assert stored is not None
    kept = [m.text.split(" ")[:2] for m in stored.checkpoint["channel_values"]["messages"]]
    # 16 messages were written; only those the last model call could still see remain.
    assert kept == [["turn", "7"], ["ok", "word"]]
    assert [m.text.split(" ")[:2] for m in model.seen[-1][1:]] == [["turn", "7"]]


async def test_ask_agent_before_the_agent_runs_is_a_clear_error_result() -> None:
    # Clients are served only once Gateway.running has built the runner; a call outside that
    # (an embedding application calling the tool itself) gets an error result, not a crash.
    tool = AgentTool(parse_config({}, {}, source="t").agent)
    result = await tool.call({"query": "hello"}, OPERATOR, None)
    assert isinstance(result, types.CallToolResult)
    assert result.is_error
    assert text(result) == "ask_agent: the agent is not running (the gateway is starting or stopping)"
