"""The catalog's tools as the agent's model sees them, and which of them one model call is offered.

Public names are already limited to ``[A-Za-z0-9_-]{1,64}`` (``naming.public_name``), which
every provider accepts as a function name, so the model calls tools by their public names and
no second mapping exists to drift from the catalog.

A ``Toolbox`` is a run's view of one catalog snapshot: what the agent's configuration and the
calling client's policy let it call, looked up by name, never copied whole. Model APIs refuse
more than 128 tools per request and choose worse long before that, so when the toolbox holds
more than ``agent.max_tools`` a model call is offered the ``max_tools - 1`` most relevant to
the conversation (found by the tool index) plus ``search_tools``, with which the model finds
the others; what it finds is offered from the next turn on, the least relevant dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types as types

from agent_gateway.catalog import CatalogSnapshot, Part
from agent_gateway.config import AgentConfig
from agent_gateway.naming import is_selected, matches_any
from agent_gateway.search.engine import Found, ToolSearch
from agent_gateway.search.tools import ANSWER_BYTES, SEARCH_TOOLS, search_tool, within_answer


@dataclass(frozen=True, slots=True)
class AgentTool:
    """One catalog tool the agent may call."""

    name: str
    tool: types.Tool
    upstream: str
    needs_approval: bool

    @property
    def spec(self) -> dict[str, Any]:
        """The tool in the OpenAI function format, which every LangChain chat model binds."""
        return function_spec(
            self.name, self.tool.description or self.tool.title or self.name, self.tool.input_schema
        )


def function_spec(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


SEARCH_SPEC = function_spec(
    SEARCH_TOOLS,
    "Find more tools: describe what you need in plain words. The tools found are offered to you "
    "from your next turn on, and can be called by their names.",
    search_tool(10).input_schema,
)


READ_RESOURCE = "read_resource"
"""The gateway's own tool with which the model reads what a tool result links to."""
READ_TOOL = types.Tool(
    name=READ_RESOURCE,
    description="Read a resource by its URI: what a tool result's [resource link: URI] points to. "
    "Returns its text (binary contents are described, not returned).",
    input_schema={
        "type": "object",
        "properties": {"uri": {"type": "string", "description": "The URI, as the link gives it."}},
        "required": ["uri"],
        "additionalProperties": False,
    },
)
READ_SPEC = function_spec(READ_RESOURCE, READ_TOOL.description or "", READ_TOOL.input_schema)


class Search(Protocol):
    def __call__(
        self, query: str, limit: int, upstream: str | None, accept: Callable[[str], bool]
    ) -> Awaitable[list[Found]]: ...


@dataclass(frozen=True)
class Toolbox:
    """What one run may call in one catalog snapshot."""

    snapshot: CatalogSnapshot
    config: AgentConfig
    allowed: Callable[[str], bool] | None = None
    """The calling client's policy (None: no client, everything)."""
    size: int = 0
    """How many tools this toolbox holds (worked out once per catalog version and policy)."""
    wide: bool = False
    """Whether its tools' definitions are more than one model call is offered (``within_bytes``),
    however few they are."""

    @property
    def version(self) -> int:
        return self.snapshot.version

    def accepts(self, name: str) -> bool:
        """Whether the run may call the catalog tool ``name``."""
        if name == self.config.name or name not in self.snapshot.tools:
            return False
        if not is_selected(name, self.config.tools.include, self.config.tools.exclude):
            return False
        return self.allowed is None or self.allowed(name)

    def get(self, name: str) -> AgentTool | None:
        if not self.accepts(name):
            return None
        origin = self.snapshot.tools[name]
        return AgentTool(name, origin.item, origin.upstream, _needs_approval(name, origin.item, self.config))

    def reader(self) -> AgentTool | None:
        """The gateway's ``read_resource`` as a run may call it; None where a catalog tool has
        its name, or ``agent.tools.exclude`` names it (an operator's way to turn it off).
        ``agent.require_approval`` globs apply to it as to a catalog tool."""
        if self.accepts(READ_RESOURCE) or matches_any(READ_RESOURCE, self.config.tools.exclude):
            return None
        return AgentTool(
            READ_RESOURCE, READ_TOOL, "", matches_any(READ_RESOURCE, self.config.require_approval)
        )

    def definition_bytes(self, name: str) -> int:
        """About the bytes of tool ``name``'s definition (0: no such tool)."""
        origin = self.snapshot.tools.get(name)
        part = self.snapshot.parts.get(origin.upstream) if origin is not None else None
        return part.sizes.get(name, 0) if part is not None else 0

    @property
    def searching(self) -> bool:
        """Whether a model call is offered a selection and ``search_tools``, not every tool."""
        return self.size > self.config.max_tools or self.wide

    def specs(self, offered: Sequence[str], reading: bool = False) -> list[dict[str, Any]]:
        """What one model call binds: the ``offered`` tools, ``search_tools`` when searching,
        and ``read_resource`` when ``reading`` (a tool result in view links to a resource) and
        no catalog tool has its name; the last offered left out for them past ``max_tools``."""
        own = [SEARCH_SPEC] if self.searching else []
        own += [READ_SPEC] if reading and self.reader() is not None else []
        room = self.config.max_tools - len(own)
        return [*(tool.spec for name in offered[:room] if (tool := self.get(name)) is not None), *own]

    def instructions(self, offered: Sequence[str]) -> dict[str, str]:
        """The connect-time instructions of the upstreams the ``offered`` tools come from."""
        upstreams = {self.snapshot.tools[n].upstream for n in offered if n in self.snapshot.tools}
        return {u: text for u, text in self.snapshot.instructions.items() if u in upstreams}

    def summary(self) -> str:
        """Which upstreams the agent reaches, for the ``ask_agent`` description."""
        return reach(self.snapshot, self.config)


def reach(snapshot: CatalogSnapshot, config: AgentConfig, upstreams: frozenset[str] | None = None) -> str:
    """The upstreams the agent reaches tools of, by name (of ``upstreams`` only, when given:
    those the client may reach). No counts: the description then changes only when an
    upstream comes or goes, and clients are not told of every new tool."""
    parts = [p for p in snapshot.parts.values() if upstreams is None or p.upstream in upstreams]
    shown = [p.upstream for p in parts if any(_selected(n, config) for n in p.tools)]
    return ", ".join(sorted(shown)) if shown else "no tools yet"


def _selected(name: str, config: AgentConfig) -> bool:
    return name != config.name and is_selected(name, config.tools.include, config.tools.exclude)


def allowed_in(part: Part, config: AgentConfig, allowed: Callable[[str], bool] | None) -> list[str]:
    """The tools of ``part`` the agent may call for a client whose policy is ``allowed``."""
    return [n for n in part.tools if _selected(n, config) and (allowed is None or allowed(n))]


class Reach:
    """How many tools a run may call, per catalog version and client policy, worked out one
    upstream part at a time (a part that did not change is not read again)."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._parts: dict[tuple[int, str | None], tuple[Part, list[str]]] = {}
        self._sizes: dict[tuple[int, str | None], tuple[int, tuple[str, ...]]] = {}

    def of(
        self, snapshot: CatalogSnapshot, policy: str | None, allowed: Callable[[str], bool] | None
    ) -> tuple[int, tuple[str, ...]]:
        """The toolbox's size, and its names when it is small enough to offer whole (in count,
        and in its definitions' bytes)."""
        key = (snapshot.version, policy)
        if (known := self._sizes.get(key)) is None:
            names = [n for part in snapshot.parts.values() for n in self._part(part, policy, allowed)]
            small = len(names) <= self._config.max_tools and _narrow(snapshot, names)
            if len(self._sizes) >= _KEPT:
                self._sizes.clear()
                self._parts = {k: v for k, v in self._parts.items() if v[0] in snapshot.parts.values()}
            known = self._sizes[key] = (len(names), tuple(names) if small else ())
        return known

    def _part(self, part: Part, policy: str | None, allowed: Callable[[str], bool] | None) -> list[str]:
        key = (id(part), policy)
        cached = self._parts.get(key)
        if cached is None or cached[0] is not part:
            cached = self._parts[key] = (part, allowed_in(part, self._config, allowed))
        return cached[1]


_KEPT = 64


def _narrow(snapshot: CatalogSnapshot, names: Sequence[str]) -> bool:
    """Whether the definitions of ``names`` fit what one model call is offered."""
    held = 0
    for name in names:
        part = snapshot.parts.get(snapshot.tools[name].upstream)
        held += part.sizes.get(name, 0) if part is not None else 0
    return held <= ANSWER_BYTES


def _needs_approval(public: str, tool: types.Tool, config: AgentConfig) -> bool:
    if matches_any(public, config.require_approval):
        return True
    destructive = tool.annotations is not None and tool.annotations.destructive_hint is True
    return destructive and config.approve_destructive == "ask"


def system_prompt(instructions: str, toolbox: Toolbox, offered: Sequence[str]) -> str:
    """The agent's instructions followed by those of the offered tools' upstreams, labelled."""
    parts = [instructions.strip()]
    parts += [f"[{upstream}] {text.strip()}" for upstream, text in toolbox.instructions(offered).items()]
    return "\n\n".join(p for p in parts if p)


def merged(offered: Sequence[str], found: Sequence[str], keep: int) -> list[str]:
    """``found`` first (the model just asked for them), then what was offered, at most ``keep``."""
    names = list(dict.fromkeys([*found, *offered]))
    return names[:keep]


def within_bytes(toolbox: Toolbox, names: Sequence[str]) -> list[str]:
    """The first of ``names`` whose definitions fit what a search answers (one at least): 39
    tools of ~260 KB made each model call 10 MB, past any model's context window, and the
    model finds the rest with ``search_tools``."""
    return within_answer(names, toolbox.definition_bytes)


def searcher(index: ToolSearch | None, toolbox: Toolbox, party: str) -> Search | None:
    """How a run of ``party`` searches ``index`` over its ``toolbox``'s snapshot (None: no index)."""
    if index is None:
        return None

    async def search(
        query: str, limit: int, upstream: str | None, accept: Callable[[str], bool]
    ) -> list[Found]:
        found, _ = await index.search(
            toolbox.snapshot, query, limit, upstream=upstream, accept=accept, party=party
        )
        return found

    return search
