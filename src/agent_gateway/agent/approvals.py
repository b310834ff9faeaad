"""Asking the client, through MCP elicitation, before the agent runs a tool that needs approval.

A refusal is not an error of the run: it comes back to the model as the tool's result, so
the model can explain or choose another way.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import mcp_types as types

from agent_gateway.agent.toolbox import AgentTool
from agent_gateway.proxy import Caller

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


async def refusal(
    tool: AgentTool, arguments: dict[str, Any], caller: Caller | None, asker: str, wait_limit: float
) -> str | None:
    """None when ``tool`` may run; otherwise why not, in words the model can act on."""
    if caller is None:
        return f"Tool {tool.name} needs a user's approval, and this run has no client to ask."
    answer: types.InputResponse | types.ErrorData | None = None
    with anyio.move_on_after(wait_limit):
        try:
            answer = await caller.ask(asker, _request(tool, arguments))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return f"Tool {tool.name} was not run: the client went away before approving it."
    if answer is None:
        return f"Tool {tool.name} was not run: no approval came within {wait_limit:g}s."
    if isinstance(answer, types.ErrorData):
        logger.info("approval for %s could not be asked: %s", tool.name, answer.message)
        return (
            f"Tool {tool.name} needs the user's approval, which could not be asked "
            f"({answer.message}). It was not run."
        )
    if not isinstance(answer, types.ElicitResult):
        return f"Tool {tool.name} was not run: the client answered the approval request with {type(answer).__name__}."
    approved = answer.action == "accept" and (answer.content or {}).get("approve", True) is not False
    logger.info("approval for %s: %s", tool.name, "granted" if approved else answer.action)
    if approved:
        return None
    verb = "dismissed the request to run" if answer.action == "cancel" else "declined to run"
    return f"The user {verb} {tool.name}. It was not run; do not try it again in this run."


def _request(tool: AgentTool, arguments: dict[str, Any]) -> types.ElicitRequest:
    shown = json.dumps(arguments, ensure_ascii=False, default=str)
    if len(shown) > _SHOWN_ARGUMENTS:
        shown = shown[:_SHOWN_ARGUMENTS] + " …"
    why = "it may change or delete data" if _destructive(tool.tool) else "it is configured to need approval"
    message = f"The agent wants to run {tool.name} ({why}) with arguments {shown}. Allow it?"
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=_SCHEMA)
    )


def _destructive(tool: types.Tool) -> bool:
    return tool.annotations is not None and tool.annotations.destructive_hint is True
