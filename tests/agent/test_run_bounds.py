"""What one ``ask_agent`` run keeps of a model's large tool calls and of large tool results: the
record's arguments cut, and the turn's bound held within a tool step."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from fastmcp import FastMCP
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from mcp import Client

from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import agent_gateway, ask, record, text
from tests.support import running_gateway, serving_upstream

WIDE = "é" * 80_000
"""A tool call's argument just under a reply's bound (500,000 characters once JSON-escaped,
six for each "é")."""


async def test_a_runs_record_keeps_each_tool_calls_arguments_cut_saying_how_long_they_were(
    tmp_path: Path,
) -> None:
    # Four turns of 80,000 non-ASCII characters of arguments each: the record kept them whole,
    # 1.9 MB of JSON, past a client's 1 MiB bound on an answer.
    model = ScriptedChatModel(
        script=[calls(call("words__upper", text=WIDE)) for _ in range(4)] + [answer("Done.")]
    )
    # A context window wide enough for the turns: only the record's bound is under test.
    async with (
        agent_gateway(model, tmp_path, max_context_tokens=400_000) as (gw, _, words),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Shout it four times.")
    assert not result.is_error, text(result)
    assert [len(c["text"]) for _, c in words.calls] == [80_000] * 4  # the tool had them whole
    kept = record(result)
    size = len(json.dumps(kept))
    assert size < 40_000, size  # 24,835 here
    for made in kept["tool_calls"]:
        cut = made["arguments"]["cut_by_gateway"]
        assert cut.startswith('{"text": "éé')
        assert cut.endswith("… (80012 characters)")


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
