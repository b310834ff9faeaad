"""The JSON envelope read from a client model's reply, fenced or not."""

from __future__ import annotations

import pytest

from agent_gateway.agent.envelope import EnvelopeError, FinalEnvelope, ToolCallEnvelope, parse

FINAL = '{"type": "final", "answer": "done"}'


@pytest.mark.parametrize(
    "reply",
    [
        FINAL,
        f"```json\n{FINAL}\n```",
        f"```\n{FINAL}\n```",
        f"```json{FINAL}```",
        f"  ```json\r\n{FINAL}\r\n```  ",
        f"```json\u00a0{FINAL}\u2003```",
    ],
    ids=["bare", "json-fence", "plain-fence", "fence-on-one-line", "crlf-and-padding", "unicode-spaces"],
)
def test_an_envelope_is_read_inside_a_fence_or_without_one(reply: str) -> None:
    assert parse(reply) == FinalEnvelope("done")


@pytest.mark.parametrize(
    "reply",
    ["``````", "```json```", "`````", f"```jsonx{FINAL}```", f"```{FINAL}"],
    ids=["six-backticks", "empty-json-fence", "five-backticks", "other-label", "unclosed"],
)
def test_a_fence_around_no_envelope_is_refused_with_a_reason(reply: str) -> None:
    with pytest.raises(EnvelopeError, match="the reply is not a single JSON object"):
        parse(reply)


@pytest.mark.parametrize(
    "reply",
    [
        '{"type": "tool_call", "tool": "a__b", "arguments": {"x": 1}}',
        '{"type": "tool_call", "name": "a__b", "args": {"x": 1}}',
        '{"type": "tool_call", "name": "a__b", "input": {"x": 1}}',
    ],
    ids=["ours", "seed", "input"],
)
def test_a_tool_call_is_read_in_every_spelling_models_write(reply: str) -> None:
    # The seed protocol (and models trained on Anthropic's tool_use) write name/args or input:
    # refused, a model following it was corrected three times and its run failed.
    assert parse(reply) == ToolCallEnvelope("a__b", {"x": 1})


def test_a_final_answer_is_read_as_answer_or_content() -> None:
    assert parse('{"type": "final", "content": "done"}') == parse(FINAL) == FinalEnvelope("done")
