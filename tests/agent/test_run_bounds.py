"""What one ``ask_agent`` run keeps of a model's large tool calls and of large tool results: the
record's arguments cut, and the turn's bound held within a tool step."""

from __future__ import annotations

import json
from pathlib import Path

from mcp import Client

from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import agent_gateway, ask, record, text

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
