"""An upstream with a thousand tools and more: ten services, each with a hundred, plus a few
that only one request would need. Records each call it receives by tool name."""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import Tool

SERVICES = (
    "billing",
    "crm",
    "hr",
    "inventory",
    "marketing",
    "payroll",
    "procurement",
    "sales",
    "support",
    "legal",
)
THINGS = (
    "record",
    "report",
    "contract",
    "note",
    "contact",
    "document",
    "request",
    "entry",
    "profile",
    "item",
)
VERBS = ("create", "get", "list", "update", "delete", "search", "archive", "assign", "export", "import")
SPECIAL = {
    "oncall_acknowledge_incident": "Acknowledge a triggered incident so that its responders stop being paged.",
    "weather_forecast": "The weather forecast for a city for the next days.",
}


class _Recorder(Middleware):
    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self._calls = calls

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        self._calls.append((context.message.name, dict(context.message.arguments or {})))
        return await call_next(context)


def build(calls: list[tuple[str, dict[str, Any]]]) -> FastMCP:
    """The server; ``calls`` receives (tool name, arguments) of each call."""
    server = FastMCP("many", middleware=[_Recorder(calls)])

    def run(id: str) -> str:
        return f"done: {id}"

    template = Tool.from_function(run, name="template", description="")
    for service in SERVICES:
        for thing in THINGS:
            for verb in VERBS:
                name = f"{service}_{verb}_{thing}"
                description = f"{verb.title()} a {thing} in the {service} system."
                server.add_tool(template.model_copy(update={"name": name, "description": description}))
    for name, description in SPECIAL.items():
        server.add_tool(template.model_copy(update={"name": name, "description": description}))
    return server


TOOL_COUNT = len(SERVICES) * len(THINGS) * len(VERBS) + len(SPECIAL)
