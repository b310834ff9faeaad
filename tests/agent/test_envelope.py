"""The JSON envelope read from a client model's reply, fenced or not."""

from __future__ import annotations

import pytest

from agent_gateway.agent.envelope import EnvelopeError, FinalEnvelope, parse

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
