"""The catalog's tools as the agent's model sees them: one immutable toolbox per catalog version.

Public names are already limited to ``[A-Za-z0-9_-]{1,64}`` (``naming.public_name``), which
every provider accepts as a function name, so the model calls tools by their public names and
no second mapping exists to drift from the catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from agent_gateway.catalog import CatalogSnapshot
from agent_gateway.config import AgentConfig
from agent_gateway.naming import is_selected, matches_any


@dataclass(frozen=True, slots=True)
class AgentTool:
    """One catalog tool offered to the model."""

    name: str
    tool: types.Tool
    upstream: str
    needs_approval: bool

    @property
    def spec(self) -> dict[str, Any]:
        """The tool in the OpenAI function format, which every LangChain chat model binds."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.tool.description or self.tool.title or self.name,
                "parameters": self.tool.input_schema,
            },
        }


@dataclass(frozen=True)
class Toolbox:
    """What the agent may call in one catalog version, and what each upstream told us to say."""

    version: int
    tools: Mapping[str, AgentTool] = field(default_factory=dict)
    instructions: Mapping[str, str] = field(default_factory=dict)

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [tool.spec for tool in self.tools.values()]

    def summary(self) -> str:
        """Which upstreams the agent reaches, for the ``ask_agent`` description."""
        counts: dict[str, int] = {}
        for tool in self.tools.values():
            counts[tool.upstream] = counts.get(tool.upstream, 0) + 1
        if not counts:
            return "no tools yet"
        return ", ".join(f"{upstream} ({n} tools)" for upstream, n in sorted(counts.items()))


def build_toolbox(
    snapshot: CatalogSnapshot, config: AgentConfig, allowed: Callable[[str], bool] | None = None
) -> Toolbox:
    """The tools of ``snapshot`` the agent may use under ``config`` (its own tool excluded),
    and, given ``allowed(name)`` (the calling client's policy), only those it allows."""
    tools: dict[str, AgentTool] = {}
    for public, origin in snapshot.tools.items():
        if public == config.name or not is_selected(public, config.tools.include, config.tools.exclude):
            continue
        if allowed is not None and not allowed(public):
            continue
        tools[public] = AgentTool(
            public, origin.item, origin.upstream, _needs_approval(public, origin.item, config)
        )
    return Toolbox(snapshot.version, tools, dict(snapshot.instructions))


def _needs_approval(public: str, tool: types.Tool, config: AgentConfig) -> bool:
    if matches_any(public, config.require_approval):
        return True
    destructive = tool.annotations is not None and tool.annotations.destructive_hint is True
    return destructive and config.approve_destructive == "ask"


def system_prompt(instructions: str, toolbox: Toolbox) -> str:
    """The agent's instructions followed by each upstream's own, labelled by upstream."""
    parts = [instructions.strip()]
    parts += [f"[{upstream}] {text.strip()}" for upstream, text in toolbox.instructions.items()]
    return "\n\n".join(p for p in parts if p)
