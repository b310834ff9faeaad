"""``ask_agent`` as a FastMCP tool, listed next to the catalog's and rebuilt with it."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from fastmcp.server.providers import Provider
from fastmcp.tools.base import InputRequiredToolResult, Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec
from jsonschema import Draft202012Validator
from pydantic import PrivateAttr

from agent_gateway import access
from agent_gateway.activity import refused
from agent_gateway.agent.runner import AgentRequest, AgentRunner
from agent_gateway.agent.toolbox import reach as toolbox_reach
from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.downstream.caller import current_caller
from agent_gateway.errors import ClientLimited
from agent_gateway.search.tools import argument_problem, plain_words

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": plain_words("What you want done or answered, in plain words."),
        "conversation_id": {
            "type": "string",
            "minLength": 1,
            "description": "Continue this conversation (the thread_id of an earlier answer). "
            "Default: this MCP session's conversation.",
        },
        "context": {"type": "object", "description": "Extra facts for the agent, as a JSON object."},
    },
    "required": ["query"],
    "additionalProperties": False,
}

_RECORD = {"type": "object", "additionalProperties": True}
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": ["string", "null"]},
        "thread_id": {"type": "string"},
        "run_id": {"type": "string"},
        "steps": {"type": "integer"},
        "tool_calls": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "arguments": _RECORD,
                    "is_error": {"type": "boolean"},
                    "duration_ms": {"type": "number"},
                },
                "required": ["name", "arguments", "is_error", "duration_ms"],
            },
        },
        "usage": {
            "type": "object",
            "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}},
            "required": ["input_tokens", "output_tokens"],
        },
        "model": {"type": "string"},
        "started_at": {"type": "string"},
        "ended_at": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
    },
    "required": [
        "answer",
        "thread_id",
        "run_id",
        "steps",
        "tool_calls",
        "usage",
        "model",
        "started_at",
        "ended_at",
    ],
}

_VALIDATOR = Draft202012Validator(INPUT_SCHEMA)


class AskAgentTool(Tool):
    """The gateway's own tool: a request in plain words, answered by the agent."""

    _runner: AgentRunner = PrivateAttr()

    @classmethod
    def build(
        cls, runner: AgentRunner, snapshot: CatalogSnapshot, upstreams: frozenset[str] | None = None
    ) -> AskAgentTool:
        reach = toolbox_reach(snapshot, runner.config, upstreams)
        tool = cls(
            name=runner.config.name,
            title="Ask the gateway's agent",
            description=(
                "Ask agent-gateway's own agent to do something with the tools behind this gateway. "
                "It plans, calls the tools it needs (several at once when it can) and answers in "
                f"plain words, with a record of every tool call. It can reach: {reach}. "
                "Pass conversation_id (an earlier answer's thread_id) to continue a conversation."
            ),
            parameters=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
        )
        tool._runner = runner
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        if (problem := invalid(arguments, self.name)) is not None:
            return ToolResult(content=[types.TextContent(type="text", text=problem)], is_error=True)
        request = AgentRequest(arguments["query"], arguments.get("conversation_id"), arguments.get("context"))
        client = access.current()
        if client is None:  # fail closed: a run is for someone
            return ToolResult(content=[types.TextContent(type="text", text=_NO_IDENTITY)], is_error=True)
        try:
            with client.running_agent():
                outcome = await self._runner.run(request, client, current_caller(client))
        except ClientLimited as exc:
            refused(type(exc).__name__)
            return ToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
        usage = outcome.record.get("usage") or {}
        client.spent.used(int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0)))
        if outcome.pending is not None:
            return InputRequiredToolResult(outcome.pending)
        return ToolResult(
            content=[types.TextContent(type="text", text=outcome.text)],
            structured_content=outcome.record,
            is_error=outcome.error is not None,
        )


_NO_IDENTITY = "ask_agent refused: the request carries no client identity"


def invalid(arguments: dict[str, Any], tool: str) -> str | None:
    """Why ``arguments`` do not fit ``INPUT_SCHEMA``, or None."""
    problem = argument_problem(_VALIDATOR, arguments)
    return None if problem is None else f"Invalid arguments for {tool}: {problem}"


class AgentProvider(Provider):
    """Supplies FastMCP with ``ask_agent`` (for ``tools/call``; ``tools/list`` lists its
    ``definition``), its description rebuilt when the catalog changes."""

    def __init__(self, runner: AgentRunner, catalog: Catalog) -> None:
        super().__init__()
        self.name = runner.config.name
        self._runner = runner
        self._catalog = catalog
        self._built: dict[tuple[int, frozenset[str] | None], AskAgentTool] = {}

    def _tool(self, snapshot: CatalogSnapshot, upstreams: frozenset[str] | None = None) -> AskAgentTool:
        key = (snapshot.version, upstreams)
        if (tool := self._built.get(key)) is None:
            if len(self._built) >= _KEPT:
                self._built.clear()
            tool = self._built[key] = AskAgentTool.build(self._runner, snapshot, upstreams)
        return tool

    def definition(self, snapshot: CatalogSnapshot, upstreams: frozenset[str] | None = None) -> types.Tool:
        """``ask_agent`` as ``tools/list`` shows it in ``snapshot`` to a client that reaches
        ``upstreams`` (None: every one): it names only those."""
        return self._tool(snapshot, upstreams).to_mcp_tool(name=self.name)

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        if name != self.name or not access.visible("tool", name):
            return None
        return self._tool(self._catalog.snapshot)


_KEPT = 64
