"""Asking the client, through MCP elicitation, before the agent runs a tool that needs approval.

A refusal is not an error of the run: it comes back to the model as the tool's result, so
the model can explain or choose another way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from agent_gateway.agent.asking import Answer, Asker
from agent_gateway.agent.toolbox import AgentTool

logger = logging.getLogger(__name__)

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Run this tool?",
            "description": "Let the agent run this tool with these arguments.",
            "default": True,
        }
    },
    "required": ["approve"],
}
_SHOWN_ARGUMENTS = 2_000


@dataclass(frozen=True)
class Proposed:
    """A tool call the model proposed that needs approval before it runs."""

    tool: AgentTool
    arguments: dict[str, Any]


async def refusals(
    proposed: Mapping[str, Proposed], asker: Asker | None, wait_limit: float
) -> dict[str, str | None]:
    """For each proposed call (keyed by the caller), None when it may run, else why not.

    All are asked at once: a modern client answers them in one round, and a person sees
    every call of a model turn before any of them runs.
    """
    if not proposed:
        return {}
    if asker is None:
        return {
            k: f"Tool {p.tool.name} needs a user's approval, and this run has no client to ask."
            for k, p in proposed.items()
        }
    answers = await asker.ask({k: _request(p) for k, p in proposed.items()}, wait_limit)
    return {k: _verdict(p.tool.name, answers.get(k), wait_limit) for k, p in proposed.items()}


def _verdict(name: str, answer: Answer, wait_limit: float) -> str | None:
    if answer is None:
        return f"Tool {name} was not run: no approval came within {wait_limit:g}s."
    if isinstance(answer, types.ErrorData):
        logger.info("approval for %s could not be asked: %s", name, answer.message)
        return f"Tool {name} needs the user's approval, which could not be asked ({answer.message}). It was not run."
    if not isinstance(answer, types.ElicitResult):
        return (
            f"Tool {name} was not run: the client answered the approval request with {type(answer).__name__}."
        )
    # Only the form's own "yes": an answer that does not fit it ("false", 0, no field) approves
    # nothing, whatever a client meant by it.
    approved = answer.action == "accept" and (answer.content or {}).get("approve") is True
    logger.info("approval for %s: %s", name, "granted" if approved else answer.action)
    if approved:
        return None
    if answer.action == "accept":
        return f"Tool {name} was not run: the approval answered did not say yes (approve: true)."
    verb = "dismissed the request to run" if answer.action == "cancel" else "declined to run"
    return f"The user {verb} {name}. It was not run; do not try it again in this run."


def _request(proposed: Proposed) -> types.ElicitRequest:
    tool = proposed.tool
    shown = json.dumps(proposed.arguments, ensure_ascii=False, default=str)
    if len(shown) > _SHOWN_ARGUMENTS:
        shown = shown[:_SHOWN_ARGUMENTS] + " …"
    why = "it may change or delete data" if _destructive(tool.tool) else "it is configured to need approval"
    message = f"The agent wants to run {tool.name} ({why}) with arguments {shown}. Allow it?"
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=_SCHEMA)
    )


def _destructive(tool: types.Tool) -> bool:
    return tool.annotations is not None and tool.annotations.destructive_hint is True
