"""``search_tools`` and ``call_tool``: the two tools a client in search mode reaches the catalog with.

The names are the ones other implementations use (FastMCP's search transforms among them),
so a client or model that knows one knows these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import mcp_types as types
from jsonschema import Draft202012Validator

from agent_gateway.errors import InvalidArguments, shown
from agent_gateway.listing import PAGE_BYTES
from agent_gateway.naming import CALL_TOOL, MAX_NAME_LENGTH, SEARCH_TOOLS
from agent_gateway.schema_check import reason
from agent_gateway.search.engine import Found

T = TypeVar("T")
MAX_LIMIT = 50
ANSWER_BYTES = PAGE_BYTES
"""About the most definition bytes one search's answer holds (one tool at least, however large),
as a ``tools/list`` page: 50 tools of the largest real schemas made a 12.7 MB answer, serialised
on the event loop while every other client waited."""
WEAK = 0.25
"""Below this score a result matches little of the request; its listing line says so."""


def plain_words(description: str) -> dict[str, Any]:
    """The schema of a required request in plain words (not empty, not only blanks)."""
    return {"type": "string", "minLength": 1, "pattern": r"\S", "description": description}


_SEARCH_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": plain_words(
            "What you want to do, in plain words (e.g. 'open a ticket in the web team's tracker')."
        ),
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIMIT,
            "description": "How many tools to return, best first.",
        },
        "upstream": {"type": "string", "description": "Only tools of this upstream server."},
    },
    "required": ["query"],
    "additionalProperties": False,
}
_SEARCH_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "title": {"type": "string"},
                    "description": {"type": "string"},
                    "inputSchema": {"type": "object"},
                    "upstream": {"type": "string"},
                    "score": {"type": "number"},
                },
                "required": ["name", "inputSchema", "upstream", "score"],
            },
        },
        "total": {"type": "integer"},
    },
    "required": ["tools", "total"],
}
_CALL_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_NAME_LENGTH,  # as a direct call's name: no longer than any public name
            "description": "A tool's name, as search_tools gave it.",
        },
        "arguments": {"type": "object", "description": "The tool's arguments, matching its inputSchema."},
    },
    "required": ["name"],
    "additionalProperties": False,
}
_SEARCH_VALIDATOR = Draft202012Validator(_SEARCH_INPUT)
_CALL_VALIDATOR = Draft202012Validator(_CALL_INPUT)


def search_tool(default_limit: int) -> types.Tool:
    return types.Tool(
        name=SEARCH_TOOLS,
        title="Search the gateway's tools",
        description=(
            "Find the tools behind this gateway that can do what you describe. Returns the best "
            f"matches first ({default_limit} unless you give a limit), each with its name, description, "
            f"input schema and a score from 0 to 1 (under {WEAK} matches little of the request). "
            f"Call a tool it finds with {CALL_TOOL}, or directly by its name."
        ),
        input_schema=_SEARCH_INPUT,
        output_schema=_SEARCH_OUTPUT,
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )


def call_tool() -> types.Tool:
    return types.Tool(
        name=CALL_TOOL,
        title="Call a tool found with search_tools",
        description=(
            f"Call one of the gateway's tools by the name {SEARCH_TOOLS} gave, with arguments matching its "
            "input schema. Returns that tool's own result."
        ),
        input_schema=_CALL_INPUT,
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=True),
    )


@dataclass(frozen=True)
class SearchRequest:
    query: str
    limit: int | None
    upstream: str | None


def search_request(arguments: dict[str, Any]) -> SearchRequest:
    """``search_tools``' arguments (raises ``InvalidArguments``)."""
    _check(_SEARCH_VALIDATOR, SEARCH_TOOLS, arguments)
    limit = arguments.get("limit")
    # JSON Schema's integer includes 5.0 (and 1e1): a number, not a Python int.
    return SearchRequest(arguments["query"], None if limit is None else int(limit), arguments.get("upstream"))


def call_request(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``call_tool``'s arguments: the tool's name and its arguments (raises ``InvalidArguments``)."""
    _check(_CALL_VALIDATOR, CALL_TOOL, arguments)
    return arguments["name"], arguments.get("arguments") or {}


def _check(validator: Draft202012Validator, tool: str, arguments: dict[str, Any]) -> None:
    if (problem := argument_problem(validator, arguments)) is not None:
        raise InvalidArguments(tool, problem)


def argument_problem(validator: Draft202012Validator, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` fail ``validator``'s schema (the first reason), or None."""
    error = next(iter(validator.iter_errors(arguments)), None)
    if error is None:
        return None
    if list(error.absolute_path) == ["query"] and error.validator in ("minLength", "pattern"):
        return "query: must not be empty"
    return reason(error)


def within_answer(found: Sequence[T], size: Callable[[T], int]) -> list[T]:
    """The first of ``found`` (best first) whose definitions (``size``: about their bytes) fit
    ``ANSWER_BYTES``, one at least: what a search answers, and what an agent's model is offered."""
    kept: list[T] = []
    held = 0
    for one in found:
        held += size(one)
        if kept and held > ANSWER_BYTES:
            break
        kept.append(one)
    return kept


def search_result(found: Sequence[Found], total: int, query: str, left_out: int = 0) -> types.CallToolResult:
    """The ``search_tools`` answer: a short listing, and the tools in ``structuredContent``;
    ``left_out``: the next best, not sent as their definitions would pass ``ANSWER_BYTES``."""
    if not found:
        text = f"No tool matches {shown(query)}. Try other words, or fewer."
    else:
        lines = [f"{len(found)} of {total} matching tools, best first:"]
        lines += [_line(f) for f in found]
        if left_out:
            lines.append(
                f"({left_out} more within your limit left out: their definitions would take this answer "
                f"past {ANSWER_BYTES:,} bytes. Narrow the request, or give an upstream.)"
            )
        text = "\n".join(lines)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"tools": [_entry(f) for f in found], "total": total},
    )


def _line(found: Found) -> str:
    summary = (found.tool.description or found.tool.title or "").strip().splitlines()
    first = summary[0][:160] if summary else ""
    weak = " (weak match)" if found.score < WEAK else ""
    return f"- {found.tool.name} [{found.upstream}, {found.score:.2f}{weak}]: {first}"


def _entry(found: Found) -> dict[str, Any]:
    tool = found.tool
    entry: dict[str, Any] = {"name": tool.name}
    if tool.title:
        entry["title"] = tool.title
    entry["description"] = tool.description or ""
    entry["inputSchema"] = tool.input_schema
    entry["upstream"] = found.upstream
    entry["score"] = found.score
    return entry
