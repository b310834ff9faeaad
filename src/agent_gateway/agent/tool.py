"""``ask_agent``: the gateway's own tool, listed next to the catalog's (rebuilt with it)
and called on the same pipeline as they are."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from jsonschema import Draft202012Validator

from agent_gateway.access import Principal
from agent_gateway.activity import refused
from agent_gateway.agent.request import AgentRequest
from agent_gateway.agent.toolbox import reach as toolbox_reach
from agent_gateway.catalog import CatalogSnapshot
from agent_gateway.config import AgentConfig
from agent_gateway.downstream.caller import Caller
from agent_gateway.errors import ClientLimited
from agent_gateway.search.tools import argument_problem, plain_words

if TYPE_CHECKING:
    from agent_gateway.agent.runner import AgentRunner

RUNNER_MODULE = "agent_gateway.agent.runner"
"""Where ``AgentRunner`` is: imported by name, in a worker thread (``AgentTool.runner_class``)."""

MAX_QUERY_CHARS = 100_000
"""The longest ``query``, and the longest ``context`` as JSON: more than the default context
window (32,000 tokens) holds. Unbounded, a client's 3.5 MB queries (within its 60 runs a
minute) grew the gateway by 1 GB and its conversation store by 350 MB in 30 runs."""

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": plain_words("What you want done or answered, in plain words.")
        | {"maxLength": MAX_QUERY_CHARS},
        "conversation_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 256,
            "description": "Continue this conversation (the thread_id of an earlier answer). "
            "Default: this MCP session's conversation.",
        },
        "context": {
            "type": "object",
            "description": f"Extra facts for the agent, as a JSON object (at most {MAX_QUERY_CHARS:,} characters of it).",
        },
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
        "tool_calls_left_out": {"type": "integer", "minimum": 0},
        "usage": {
            "type": "object",
            "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}},
            "required": ["input_tokens", "output_tokens"],
        },
        "offered_tools": {
            "type": "object",
            "properties": {
                "count": {"type": "integer"},
                "names": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["count", "names"],
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
        "tool_calls_left_out",
        "usage",
        "offered_tools",
        "model",
        "started_at",
        "ended_at",
    ],
}

_VALIDATOR = Draft202012Validator(INPUT_SCHEMA)
_ANNOTATIONS = types.ToolAnnotations(read_only_hint=False, open_world_hint=True)
_KEPT = 64


class AgentTool:
    """``ask_agent``: its definition (``tools/list``), rebuilt when the catalog changes, and
    its calls, served on the pipeline with the request's own client and caller by the agent's
    runner while it runs (:meth:`serving`)."""

    def __init__(self, config: AgentConfig) -> None:
        self.name = config.name
        self._config = config
        self._runner: AgentRunner | None = None
        self._built: dict[tuple[int, frozenset[str] | None], types.Tool] = {}

    async def runner_class(self, imported: anyio.Event) -> type[AgentRunner]:
        """``AgentRunner``, once its module is ``imported`` (in a worker thread while the
        upstreams connect: ``runtime.importing(RUNNER_MODULE)``)."""
        await imported.wait()  # bounded by the import itself
        # Imported already: this binds the name. At the top of this module it would load
        # LangChain and LangGraph with the gateway, before the upstreams start connecting.
        from agent_gateway.agent.runner import AgentRunner

        return AgentRunner

    @asynccontextmanager
    async def serving(self, runner: AgentRunner) -> AsyncIterator[None]:
        """Serve calls with ``runner`` while it runs (the body)."""
        async with runner.running():
            self._runner = runner
            try:
                yield
            finally:
                self._runner = None

    def definition(self, snapshot: CatalogSnapshot, upstreams: frozenset[str] | None = None) -> types.Tool:
        """``ask_agent`` as ``tools/list`` shows it in ``snapshot`` to a client that reaches
        ``upstreams`` (None: every one): it names only those."""
        key = (snapshot.version, upstreams)
        if (tool := self._built.get(key)) is None:
            if len(self._built) >= _KEPT:
                self._built.clear()
            tool = self._built[key] = self._build(snapshot, upstreams)
        return tool

    def _build(self, snapshot: CatalogSnapshot, upstreams: frozenset[str] | None) -> types.Tool:
        reach = toolbox_reach(snapshot, self._config, upstreams)
        return types.Tool(
            name=self.name,
            title="Ask the gateway's agent",
            description=(
                "Ask agent-gateway's own agent to do something with the tools behind this gateway. "
                "It plans, calls the tools it needs (several at once when it can) and answers in "
                f"plain words, with a record of every tool call. It can reach: {reach}. "
                "Pass conversation_id (an earlier answer's thread_id) to continue a conversation."
            ),
            input_schema=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            annotations=_ANNOTATIONS,
        )

    async def call(
        self, arguments: dict[str, Any], client: Principal, caller: Caller | None
    ) -> types.CallToolResult | types.InputRequiredResult:
        """One ``ask_agent`` call for ``client`` (the identity on the request, already
        authorized for this tool); a failure is an ``isError`` result the model can read."""
        if (problem := invalid(arguments, self.name)) is not None:
            return _failed(problem)
        if (runner := self._runner) is None:
            return _failed(f"{self.name}: the agent is not running (the gateway is starting or stopping)")
        request = AgentRequest(arguments["query"], arguments.get("conversation_id"), arguments.get("context"))
        try:
            with client.running_agent(resuming=caller is not None and caller.request_state is not None):
                outcome = await runner.run(request, client, caller)
        except ClientLimited as exc:
            refused(type(exc).__name__)
            return _failed(str(exc))
        if outcome.pending is not None:
            return outcome.pending
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=outcome.text)],
            structured_content=outcome.record,
            is_error=outcome.error is not None,
        )


def _failed(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def invalid(arguments: dict[str, Any], tool: str) -> str | None:
    """Why ``arguments`` do not fit ``INPUT_SCHEMA``, or None."""
    problem = argument_problem(_VALIDATOR, arguments)
    if problem is None and "context" in arguments:
        size = len(json.dumps(arguments["context"], ensure_ascii=False))
        if size > MAX_QUERY_CHARS:
            problem = f"context: {size:,} characters of JSON, more than {MAX_QUERY_CHARS:,}"
    return None if problem is None else f"Invalid arguments for {tool}: {problem}"
