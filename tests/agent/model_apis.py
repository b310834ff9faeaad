"""Tiny OpenAI- and Anthropic-compatible HTTP endpoints that reply from a script.

The gateway's real provider clients (langchain-openai, langchain-anthropic and the SDKs under
them) talk to these over loopback HTTP, so the whole provider path runs; each endpoint keeps
the requests it received.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass
class Turn:
    """One scripted reply: tool calls, or a text answer; or an HTTP error."""

    text: str | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    """Each call's name and arguments (an object, or anything else a model may write)."""
    status: int = 200
    error: str = ""
    code: str | None = None
    refusal: str | None = None
    """The model declining the request: OpenAI's ``refusal`` (its words, the content null);
    Anthropic's ``stop_reason: refusal`` (with ``text``, if any)."""


Script = Turn | Callable[[dict[str, Any]], Turn]
"""A reply, or a function of the request's body that makes one."""
OPENAI_MAX_TOOLS = 128


@dataclass
class ScriptedApi:
    turns: list[Script]
    model: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def _next(self, request: Request) -> tuple[dict[str, Any], Turn]:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        turn = self.turns.pop(0)
        return body, turn(body) if callable(turn) else turn


def too_many_tools(body: dict[str, Any]) -> Turn | None:
    """OpenAI's own refusal of a request with more than 128 tools, or None."""
    count = len(body.get("tools") or [])
    if count <= OPENAI_MAX_TOOLS:
        return None
    message = (
        f"Invalid 'tools': array too long. Expected an array with maximum length {OPENAI_MAX_TOOLS}, "
        f"but got an array with length {count} instead."
    )
    return Turn(status=400, error=message, code="array_above_max_length")


def openai_api(turns: Sequence[Script], model: str = "gpt-test") -> tuple[Starlette, ScriptedApi]:
    """``POST /v1/chat/completions`` in the OpenAI format."""
    api = ScriptedApi(list(turns), model)

    async def completions(request: Request) -> JSONResponse:
        body, turn = await api._next(request)
        turn = too_many_tools(body) or turn
        if turn.status != 200:
            error = {"message": turn.error, "type": "invalid_request_error", "param": None, "code": turn.code}
            return JSONResponse({"error": error}, turn.status)
        message: dict[str, Any] = {"role": "assistant", "content": turn.text}
        if turn.refusal is not None:
            message["refusal"] = turn.refusal
        if turn.calls:
            message["tool_calls"] = [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, (n, a) in enumerate(turn.calls)
            ]
        return JSONResponse(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": api.model,
                "choices": [
                    {"index": 0, "message": message, "finish_reason": "tool_calls" if turn.calls else "stop"}
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])]), api


def anthropic_api(turns: Sequence[Script], model: str = "claude-test") -> tuple[Starlette, ScriptedApi]:
    """``POST /v1/messages`` in the Anthropic format."""
    api = ScriptedApi(list(turns), model)

    async def messages(request: Request) -> JSONResponse:
        _, turn = await api._next(request)
        if turn.status != 200:
            return JSONResponse(
                {"type": "error", "error": {"type": "api_error", "message": turn.error}}, turn.status
            )
        content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
        content += [
            {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
            for i, (n, a) in enumerate(turn.calls)
        ]
        return JSONResponse(
            {
                "id": "msg_test",
                "type": "message",
                "role": "assistant",
                "model": api.model,
                "content": content,
                "stop_reason": "refusal"
                if turn.refusal is not None
                else "tool_use"
                if turn.calls
                else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 13, "output_tokens": 8},
            }
        )

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])]), api
