"""What one ``ask_agent`` run keeps of a model's large tool calls and of large tool results: the
record's arguments cut, and the turn's bound held within a tool step."""

from __future__ import annotations

import gc
import json
import sqlite3
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from mcp import Client
from mcp.client.client import ConnectMode
from mcp.server.lowlevel import Server

from agent_gateway.agent.run_record import MAX_CALLS_JSON, kept_calls
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import BOUND, agent_gateway, ask, record, text
from tests.agent.test_models import sampling_client
from tests.support import running_gateway, serving, serving_upstream

WIDE = "é" * 80_000
"""A tool call's argument just under a reply's bound (500,000 characters once JSON-escaped,
six for each "é")."""


async def test_a_runs_record_keeps_each_tool_calls_arguments_cut_saying_how_long_they_were(
    tmp_path: Path,
) -> None:
    # Four turns of 80,000 non-ASCII characters of arguments each: the record kept them whole,
    # 1.9 MB of JSON, past a client's 1 MiB bound on an answer. Each call's tool_started log
    # line to the client keeps them as the record does.
    model = ScriptedChatModel(
        script=[calls(call("words__upper", text=WIDE)) for _ in range(4)] + [answer("Done.")]
    )
    started: list[dict[str, object]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        if isinstance(params.data, dict) and params.data.get("event") == "tool_started":
            started.append(params.data)

    # A context window wide enough for the turns: only the record's (and log lines') bound is under test.
    async with (
        agent_gateway(model, tmp_path, max_context_tokens=400_000) as (gw, _, words),
        Client(gw.url, mode="legacy", logging_callback=on_log) as client,
    ):
        result = await ask(client, "Shout it four times.")
        with anyio.fail_after(BOUND):  # log lines may arrive after the result
            while len(started) < 4:
                await anyio.sleep(0.01)
    assert not result.is_error, text(result)
    assert [len(c["text"]) for _, c in words.calls] == [80_000] * 4  # the tool had them whole
    kept = record(result)
    size = len(json.dumps(kept))
    assert size < 40_000, size  # 24,835 here
    assert len(kept["tool_calls"]) == 4  # each cut, so none left out for the record's bound
    for made in kept["tool_calls"]:
        cut = made["arguments"]["cut_by_gateway"]
        assert cut.startswith('{"text": "éé')
        assert cut.endswith("… (80012 characters)")
    assert [line["arguments"] for line in started] == [made["arguments"] for made in kept["tool_calls"]]


PAGE = 100_000
"""Characters of each result of the ``pages`` upstream: the most a result reaches the model with."""


def pages_server(served: list[int]) -> FastMCP:
    server = FastMCP("pages")

    @server.tool
    def page(number: int) -> str:
        """One page of a long document."""
        served.append(number)
        return "p" * PAGE

    return server


async def test_one_tool_steps_large_results_are_cut_to_the_turns_bound_and_the_model_reads_why(
    tmp_path: Path,
) -> None:
    # 32 calls of 100,000 characters each in one step: 800,000 tokens were stored in the thread
    # before the next model call's check (128,000 here) ended the run, the model none the wiser.
    served: list[int] = []
    seen: list[list[BaseMessage]] = []

    async def reads(messages: list[BaseMessage]) -> AIMessage:
        seen.append(messages)
        return answer("I read the pages that fit.")

    turn = calls(*[call("pages__page", number=n) for n in range(32)])
    model = ScriptedChatModel(script=[turn, reads])
    memory = {"store": "sqlite", "path": str(tmp_path / "conversations.sqlite")}
    async with serving_upstream(pages_server(served)) as url:
        config = {"upstreams": {"pages": {"url": url}}, "agent": {"memory": memory}}
        async with running_gateway(config, chat_model=model) as gw, Client(gw.url, mode="legacy") as client:
            result = await ask(client, "Read the whole document.")
    assert not result.is_error, text(result)
    assert sorted(served) == list(range(32))
    (view,) = seen
    assert count_tokens_approximately(view) <= 128_000
    results = [m for m in view if isinstance(m, ToolMessage)]
    assert len(results) == 32
    whole = [m for m in results if "the run's turn holds" not in m.text]
    assert whole == results[: len(whole)]  # in the model's order
    assert len(whole) >= 3
    assert results[-1].text.startswith("[100,000 of this result's 100,000 characters cut by the gateway")
    assert "holds at most about 128,000 tokens (4 times agent.max_context_tokens)" in results[-1].text
    recorded = record(result)["tool_calls"]
    assert [("result_cut" in c) for c in recorded] == [m in results[len(whole) :] for m in results]
    with sqlite3.connect(tmp_path / "conversations.sqlite") as db:
        (kept,) = db.execute("SELECT sum(length(checkpoint)) FROM checkpoints").fetchone()
    assert kept < 1_000_000, kept


QUOTES = '"' * 600
"""Arguments whose JSON is past the record's 1,000 characters, kept cut: their cut JSON, escaped
again in the record, is twice as long (2,000 characters a call)."""
NAME = "🙂" * 200
"""A name of no tool, cut to 128 characters, twelve each in escaped JSON."""


async def test_a_runs_record_keeps_its_first_tool_calls_within_its_budget_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    # Three turns of 128 calls (32 run, 96 answered "Not run"), each with a long name and
    # arguments cut to 1,000 characters: the record kept all 384, 1.4 MB of JSON, past a
    # client's 1 MiB bound on an answer (about 470 KB more each turn, up to 100 turns).
    turn = [calls(*[call(NAME, text=QUOTES) for _ in range(128)]) for _ in range(3)]
    model = ScriptedChatModel(script=[*turn, answer("Done.")])
    async with (
        agent_gateway(model, tmp_path, max_context_tokens=400_000) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Call it often.")
    assert not result.is_error, text(result)
    kept = record(result)
    assert len(json.dumps(kept["tool_calls"])) <= 256 * 1024
    assert len(json.dumps(kept)) < 300_000, len(json.dumps(kept))
    assert 0 < len(kept["tool_calls"]) < 384
    assert len(kept["tool_calls"]) + kept["tool_calls_left_out"] == 384
    assert all(c["name"] == NAME[:128] for c in kept["tool_calls"])  # the run's first calls


def test_once_a_call_is_left_out_of_a_runs_record_every_later_one_is_too() -> None:
    # The record's calls are the run's first ones, in order, then a count: a small call after
    # one left out would fit, but kept it would read as the call that came next.
    small: dict[str, object] = {"name": "t", "arguments": {}}
    large: dict[str, object] = {"name": "t", "arguments": "x" * MAX_CALLS_JSON}
    kept, left_out = kept_calls([small], [large, small], 0)
    assert (kept, left_out) == ([small], 2)
    assert kept_calls(kept, [small], left_out) == ([small], 3)


async def test_a_runs_long_answer_is_cut_in_its_text_and_record_saying_how_much(tmp_path: Path) -> None:
    # A reply of 480,000 characters outside the BMP (twelve each in escaped JSON, four in UTF-8)
    # was the result's text and its record's answer: 3.8 MB of UTF-8, 11.5 MB escaped.
    model = ScriptedChatModel(script=[answer("🙂" * 480_000)])
    async with (
        agent_gateway(model, tmp_path, max_context_tokens=400_000) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Smile a lot.")
    assert not result.is_error, text(result)
    said = text(result)
    assert said == record(result)["answer"]
    assert len(json.dumps(said)) <= 128 * 1024
    assert said.startswith("🙂🙂")
    assert "characters cut by the gateway: a run's answer is at most 131,072 characters of JSON]" in said
    shown = said.count("🙂")
    assert f"[… {480_000 - shown:,} more of the answer's 480,000 characters" in said


async def test_a_failed_runs_error_quoting_the_provider_is_cut_saying_how_long_it_was(
    tmp_path: Path,
) -> None:
    # A provider's error quoting what it was sent (2 MB here) was the result's text and its
    # record's error, whole.
    model = ScriptedChatModel(script=[RuntimeError("bad request: " + "x" * 2_000_000)])
    async with (
        agent_gateway(model, tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Fail loudly.")
    assert result.is_error
    error = record(result)["error"]
    assert error.startswith("the model call failed: RuntimeError: bad request: xxx")
    assert error.endswith("… (2000050 characters)"), error[-60:]
    assert len(error) < 2_100
    assert text(result) == f"ask_agent failed: {error}"


async def test_the_model_name_a_provider_answers_with_is_recorded_cut(tmp_path: Path) -> None:
    # The record names the model as the provider's reply did: a 2 MB name was kept whole.
    model = ScriptedChatModel(script=[answer("Hi.")], model_name="m" * 2_000_000)
    async with (
        agent_gateway(model, tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Who are you?")
    assert not result.is_error, text(result)
    assert record(result)["model"] == "m" * 256 + "… (2000000 characters)"


def smiles_server() -> FastMCP:
    server = FastMCP("pages")

    @server.tool
    def page(number: int) -> str:
        """One page of a long document."""
        return "🙂" * PAGE

    return server


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_sampling_request_past_what_a_client_reads_ends_the_run_saying_why(mode: ConnectMode) -> None:
    # The client's own model reads four results of 100,000 characters outside the BMP: within
    # the turn's bound in tokens, but a 1.6 MB sampling request. The official client could not
    # read it (its event past 1 MiB): its ask_agent call failed with no answer at all.
    seen: list[types.CreateMessageRequestParams] = []
    replies = [
        types.CreateMessageResultWithTools(
            role="assistant",
            content=[
                types.ToolUseContent(id=f"t{n}", name="pages__page", input={"number": n}) for n in range(4)
            ],
            model="client-model",
            stop_reason="toolUse",
        )
    ]
    agent = {"memory": {"store": "memory"}, "model": {"provider": "sampling"}}
    async with (
        serving_upstream(smiles_server()) as url,
        running_gateway({"upstreams": {"pages": {"url": url}}, "agent": agent}) as gw,
        sampling_client(gw.url, mode, replies, seen) as client,
    ):
        result = await ask(client, "Read the whole document.")
    assert result.is_error
    assert text(result).startswith(
        "ask_agent failed: the request to the client's model (sampling) would be 1,60"
    ), text(result)
    assert "bytes of JSON, more than the 786,432 a client is sent at once" in text(result)
    assert len(seen) == 1  # the first request only
    assert len(record(result)["tool_calls"]) == 4


async def test_a_run_waiting_for_its_busy_conversation_ends_at_its_run_timeout_without_starting(
    tmp_path: Path,
) -> None:
    # The wait for a conversation another run holds counted in no bound: runs queued on one
    # conversation each waited for every one before it (the 50th of 50 runs that each took
    # their run_timeout of 1 s answered after 50 s; of 900 s, after 12 hours), then said they
    # "did not end within 1s". Here the run before holds the thread past its own timeout: it
    # is compacted as it ends, while another process holds the SQLite file's write lock.
    asked: list[str] = []

    async def hangs(messages: list[BaseMessage]) -> AIMessage:
        asked.append(messages[-1].text)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = ScriptedChatModel(script=[hangs, answer("Free again.")])
    waits: list[types.CallToolResult] = []
    async with (
        agent_gateway(model, tmp_path, run_timeout=4) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(ask, client, "Hold on.", conversation_id="c"))
            with anyio.fail_after(BOUND):
                while not asked:
                    await anyio.sleep(0.01)
            other = sqlite3.connect(tmp_path / "conversations.sqlite", isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")  # the write lock, until the waiting run ends
                waits.append(await ask(client, "Me too.", conversation_id="c"))
            finally:
                other.close()
        again = await ask(client, "Now?", conversation_id="c")
    (waited,) = waits
    assert waited.is_error
    assert "the conversation was busy: another run on it held it for all of this run's 4s" in text(waited)
    assert asked == ["Hold on."]  # the waiting run never reached the model
    assert record(waited)["steps"] == 0
    assert text(again) == "Free again.", text(again)  # the thread is free, and served
    statuses = {run.run_id: run.status for run in gw.gateway.activity.runs}
    assert statuses[record(waited)["run_id"]] == "failed"


def frames_holding(size: int) -> list[str]:
    """The agent's frames no longer running (kept by a traceback) whose locals hold a message
    of ``size`` characters or more."""
    held: list[str] = []
    for frame in gc.get_objects():
        if not isinstance(frame, FrameType) or "agent_gateway/agent/" not in frame.f_code.co_filename:
            continue
        values = [
            v for value in frame.f_locals.values() for v in (value if isinstance(value, list) else [value])
        ]
        if any(isinstance(v, BaseMessage) and len(v.text) >= size for v in values):
            held.append(frame.f_code.co_name)
    return held


async def test_a_failed_run_lets_go_of_its_conversation_without_waiting_for_the_collector(
    tmp_path: Path,
) -> None:
    # The context bound ends the run with an error whose traceback sits in reference cycles
    # only the collector's full pass frees (every ~5 million allocations): its frames held the
    # whole conversation, ~0.65 MB a run (64 runs at a time: +42 MB every 64 runs).
    model = ScriptedChatModel(respond=lambda _: calls(call("words__upper", text="y" * 100_000)))
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        gc.collect()
        gc.disable()  # what the run leaves, as it leaves it
        try:
            result = await ask(client, "Shout this, again and again.")
            held = frames_holding(100_000)
        finally:
            gc.enable()
    assert result.is_error
    assert "the run's conversation holds about" in text(result)
    assert held == []


def links_server() -> Server:
    """An upstream whose tool ``page`` links to 1,000 resources of 100 characters each URI."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="page", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        number = (params.arguments or {}).get("number", 0)
        uris = [f"page://{number:03d}/{n:04d}/".ljust(94, "x") for n in range(1_000)]
        return types.CallToolResult(content=[types.ResourceLink(uri=uri, name="part") for uri in uris])

    return Server("links", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_one_tool_steps_links_are_cut_with_the_results_that_give_them(tmp_path: Path) -> None:
    # A result's links are kept beside its text (read_resource reads them): cut to a note by
    # the turn's bound, 32 results each kept their 100,000 characters of links, 3.2 MB in the
    # thread each step and written at each, however little of them the model could read.
    seen: list[list[BaseMessage]] = []

    async def reads(messages: list[BaseMessage]) -> AIMessage:
        seen.append(messages)
        return answer("I read the links that fit.")

    model = ScriptedChatModel(script=[calls(*[call("links__page", number=n) for n in range(32)]), reads])
    memory = {"store": "sqlite", "path": str(tmp_path / "conversations.sqlite")}
    async with serving(links_server().streamable_http_app()) as base:
        config = {"upstreams": {"links": {"url": f"{base}/mcp"}}, "agent": {"memory": memory}}
        async with running_gateway(config, chat_model=model) as gw, Client(gw.url, mode="legacy") as client:
            result = await ask(client, "Read every page's links.")
    assert not result.is_error, text(result)
    (view,) = seen
    results = [m for m in view if isinstance(m, ToolMessage)]
    assert len(results) == 32
    assert "cut by the gateway: the run's turn holds" in results[-1].text
    held = sum(len(json.dumps(m.artifact)) for m in results if m.artifact is not None)
    assert held < 1_000_000, held  # as much as the text they kept (3.3 MB before)
    with sqlite3.connect(tmp_path / "conversations.sqlite") as db:
        (kept,) = db.execute("SELECT sum(length(checkpoint)) FROM checkpoints").fetchone()
    assert kept < 2_000_000, kept  # 3.8 MB before, in one step
