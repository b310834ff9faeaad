"""The JSON envelope protocol: tool calling through a client model that only returns text.

When a client offers sampling without tool support, the agent describes its tools in the
system prompt and asks the model to answer with exactly one JSON object, either

    {"type": "tool_call", "tool": "<name>", "arguments": {...}}
    {"type": "final", "answer": "<text for the user>"}

A reply that is not one of those is answered with a correction naming what was wrong, a
bounded number of times (``sampling`` owns that loop). The protocol as first published spells
the fields ``name``/``args`` and ``content``; models that follow it are understood too
(``tool``/``name``, ``arguments``/``args``/``input``, ``answer``/``content``), and are told the
one spelling above.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import mcp_types as types

MAX_CORRECTIONS = 3

_FENCE = "```"


def _unfenced(body: str) -> str:
    r"""``body`` without a Markdown code fence around it (```` ```json … ``` ````).

    Not a regular expression: ``^```(?:json)?\s*(.*?)\s*```$`` took cubic time on a reply of
    spaces (2,000 of them: 2 s; 4,000: 17 s), and the reply is the client's model's, which
    the client writes: one client's answer stalled the gateway for everyone.
    """
    if len(body) < 2 * len(_FENCE) or not (body.startswith(_FENCE) and body.endswith(_FENCE)):
        return body
    inner = body[len(_FENCE) : -len(_FENCE)]
    return inner.removeprefix("json").strip()


class EnvelopeError(ValueError):
    """A reply that is not a valid envelope; the message says why, for the correction."""


@dataclass(frozen=True, slots=True)
class ToolCallEnvelope:
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FinalEnvelope:
    answer: str


Envelope = ToolCallEnvelope | FinalEnvelope


def instructions(tools: list[types.Tool]) -> str:
    """What the model is told about the protocol and the tools, appended to the system prompt."""
    listed = "\n".join(
        f"- {t.name}: {t.description or t.title or ''}\n  arguments schema: {json.dumps(t.input_schema)}"
        for t in tools
    )
    return (
        "You can call tools. Reply with exactly one JSON object and nothing else, in one of two forms:\n"
        '{"type": "tool_call", "tool": "<tool name>", "arguments": {<arguments matching its schema>}}\n'
        '{"type": "final", "answer": "<your answer to the user>"}\n'
        "After a tool call you will receive its result and may call another tool or answer.\n"
        f"Tools:\n{listed}"
    )


def parse(text: str) -> Envelope:
    """The envelope in a reply.

    Raises:
        EnvelopeError: the reply is not exactly one valid envelope object.
    """
    body = _unfenced(text.strip())
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise EnvelopeError(
            f"the reply is not a single JSON object ({exc.msg} at position {exc.pos})"
        ) from None
    if not isinstance(data, dict):
        raise EnvelopeError(f"the reply is JSON but a {type(data).__name__}, not an object")
    return _envelope(data)  # pyright: ignore[reportUnknownArgumentType]


_TOOL_KEYS = ("tool", "name")
_ARGUMENT_KEYS = ("arguments", "args", "input")
_ANSWER_KEYS = ("answer", "content")


def _first(data: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    return next((data[k] for k in keys if k in data), default)


def _envelope(data: dict[str, Any]) -> Envelope:
    kind = data.get("type")
    if kind == "final":
        answer = _first(data, _ANSWER_KEYS)
        if not isinstance(answer, str) or not answer.strip():
            raise EnvelopeError('a "final" object needs a non-empty string "answer"')
        return FinalEnvelope(answer)
    if kind == "tool_call":
        tool, arguments = _first(data, _TOOL_KEYS), _first(data, _ARGUMENT_KEYS, {})
        if not isinstance(tool, str) or not tool:
            raise EnvelopeError('a "tool_call" object needs a string "tool"')
        if not isinstance(arguments, dict):
            raise EnvelopeError('"arguments" must be a JSON object')
        return ToolCallEnvelope(tool, arguments)  # pyright: ignore[reportUnknownArgumentType]
    raise EnvelopeError('"type" must be "tool_call" or "final"')


def correction(reason: str) -> str:
    """The user turn sent back after an invalid reply."""
    return (
        f"Your last reply could not be used: {reason}. Reply again with exactly one JSON object, "
        'either {"type": "tool_call", "tool": ..., "arguments": {...}} or {"type": "final", "answer": ...}.'
    )


def render_call(tool: str, arguments: dict[str, Any]) -> str:
    """An earlier tool call as the model would have written it."""
    return json.dumps({"type": "tool_call", "tool": tool, "arguments": arguments}, ensure_ascii=False)


def render_result(tool: str, text: str, is_error: bool) -> str:
    """A tool's result as the user turn that follows the call."""
    status = "failed" if is_error else "returned"
    return f"Tool {tool} {status}:\n{text}"
