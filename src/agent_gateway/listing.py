"""What ``tools/list`` shows each client, page by page, and whether a change altered it.

A client sees the catalog tools its policy allows, next to the gateway's own tools. In search
mode (``search.mode: on``, or ``auto`` for a client that may see more than
``search.threshold`` tools) it sees instead its pinned tools (``search.pinned``), the
gateway's own, and ``search_tools`` / ``call_tool``, which reach everything else.

What a policy lets through is worked out once per upstream part and policy, and a view once
per catalog version and policy, so a listing costs a slice, and one upstream's change costs
that upstream's tools.

A page holds ``server.page_size`` tools, or fewer when their definitions pass ``PAGE_BYTES``:
real tools range from a few hundred bytes to 90 KB, so a page of 100 cycled from real servers
ran from 38 KB to 870 KB, and its answer's time with it (9 ms to 200 ms round trip).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mcp_types as types

from agent_gateway import access
from agent_gateway.access import Principal
from agent_gateway.catalog import Catalog, CatalogChange, CatalogSnapshot, Part
from agent_gateway.catalog_parts import size_of
from agent_gateway.config import SearchConfig
from agent_gateway.errors import InvalidRequest, to_wire
from agent_gateway.list_walks import Place, resumed
from agent_gateway.naming import matches_any

OwnTools = Callable[[CatalogSnapshot, Principal | None, bool], list[types.Tool]]
"""The gateway's own tools a client sees (``ask_agent``, the search tools when searching)."""
_VIEWS_KEPT = 64
PAGE_BYTES = 128 * 1024
"""About the most definition bytes one page holds (at least one tool, however large)."""


@dataclass(frozen=True)
class View:
    """One client's tool list in one catalog version."""

    version: int
    searching: bool
    tools: Sequence[types.Tool]
    visible: int
    """Catalog tools the client may call (listed or not)."""
    ends: tuple[int, ...]
    """Where each page ends (an offset into ``tools``), in order."""

    def page(self, start: int) -> tuple[Sequence[types.Tool], str | None]:
        """The page starting at ``start``, and the cursor of the next one (None: the last)."""
        end = self.ends[bisect.bisect_right(self.ends, start)] if start < len(self.tools) else start
        following = (
            _cursor(Place(end, self.version, self.tools[end - 1].name)) if end < len(self.tools) else None
        )
        return self.tools[start:end], following

    def __len__(self) -> int:
        return len(self.tools)

    def key(self, index: int) -> str:
        return self.tools[index].name

    def position(self, key: str) -> int | None:
        return self._positions.get(key)

    @cached_property
    def _positions(self) -> Mapping[str, int]:
        """Made only for a cursor of a version since changed (``list_walks``)."""
        return {tool.name: index for index, tool in enumerate(self.tools)}


class ToolListing:
    """Answers ``tools/list`` from the catalog."""

    def __init__(self, catalog: Catalog, config: SearchConfig, page_size: int, own_tools: OwnTools) -> None:
        self._catalog = catalog
        self._config = config
        self._page_size = page_size
        self._own_tools = own_tools
        self._views: dict[tuple[int, str | None], View] = {}
        self._allowed: dict[tuple[int, str | None], tuple[Part, tuple[str, ...]]] = {}
        self._pinned: dict[int, tuple[Part, frozenset[str]]] = {}

    async def __call__(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        """The low-level ``tools/list`` handler: nothing for a request with no client bound
        (fail closed, as ``access.visible`` is for prompts and resources)."""
        if (client := access.current()) is None:
            return types.ListToolsResult(tools=[])
        view = self.view(self._catalog.snapshot, client)
        place = _place(params.cursor if params is not None else None)
        then = self._views.get((place.version, _policy(client))) if place.version is not None else None
        tools, following = view.page(resumed(place, view, then))
        return types.ListToolsResult(tools=list(tools), next_cursor=following)

    def searching(self, client: Principal | None) -> bool:
        """Whether ``client`` is in search mode now."""
        return self.view(self._catalog.snapshot, client).searching

    def lists(self, client: Principal | None, name: str) -> bool:
        """Whether ``client``'s ``tools/list`` names the catalog tool ``name`` (in search mode,
        only if it is pinned)."""
        return not self.searching(client) or matches_any(name, self._config.pinned)

    def view(self, snapshot: CatalogSnapshot, client: Principal | None) -> View:
        key = (snapshot.version, _policy(client))
        if (view := self._views.get(key)) is None:
            if len(self._views) >= _VIEWS_KEPT:
                self._views.clear()
            view = self._views[key] = self._build(snapshot, client)
        return view

    def _build(self, snapshot: CatalogSnapshot, client: Principal | None) -> View:
        visible = sum(len(self._allowed_in(part, client)) for part in snapshot.parts.values())
        mode = self._config.mode
        searching = mode == "on" or (mode == "auto" and visible > self._config.threshold)
        tools = self._own_tools(snapshot, client, searching)
        sizes = [size_of(t) for t in tools]
        for part in snapshot.parts.values():
            names = self._listed_in(part, client, searching)
            tools += [part.listed[n] for n in names]
            sizes += [part.sizes[n] for n in names]
        return View(snapshot.version, searching, tools, visible, page_ends(sizes, self._page_size))

    def _listed_in(self, part: Part, client: Principal | None, searching: bool) -> Sequence[str]:
        allowed = self._allowed_in(part, client)
        if not searching:
            return allowed
        pinned = self._pinned_in(part)
        return [name for name in allowed if name in pinned]

    def _allowed_in(self, part: Part, client: Principal | None) -> tuple[str, ...]:
        """The part's tools the client's policy lets it see (cached per part and policy)."""
        key = (id(part), _policy(client))
        cached = self._allowed.get(key)
        if cached is not None and cached[0] is part:
            return cached[1]
        names = (
            tuple(part.tools) if client is None else tuple(n for n in part.tools if client.allows("tool", n))
        )
        self._allowed[key] = (part, names)
        return names

    def _pinned_in(self, part: Part) -> frozenset[str]:
        cached = self._pinned.get(id(part))
        if cached is not None and cached[0] is part:
            return cached[1]
        names = frozenset(n for n in part.tools if matches_any(n, self._config.pinned))
        self._pinned[id(part)] = (part, names)
        return names

    async def changed(self, change: CatalogChange) -> None:
        """Catalog listener: drop what was worked out for parts the catalog no longer holds."""
        live = {id(p) for p in change.after.parts.values()}
        self._allowed = {k: v for k, v in self._allowed.items() if k[0] in live}
        self._pinned = {k: v for k, v in self._pinned.items() if k in live}

    def changed_for(self, change: CatalogChange, client: Principal | None) -> bool:
        """Whether ``change`` altered what ``client`` is listed."""
        before, after = self.view(change.before, client), self.view(change.after, client)
        if before.searching != after.searching:
            return True
        if self._own_tools(change.before, client, before.searching) != self._own_tools(
            change.after, client, after.searching
        ):
            return True
        return any(
            _listed(old, self._listed_in(old, client, before.searching) if old else ())
            != _listed(new, self._listed_in(new, client, after.searching) if new else ())
            for old, new in (
                (change.before.parts.get(u), change.after.parts.get(u)) for u in change.upstreams
            )
        )


def page_ends(sizes: Sequence[int], page_size: int) -> tuple[int, ...]:
    """Where each page ends: after ``page_size`` tools, or before ``PAGE_BYTES`` would be
    passed (a page holds one tool at least)."""
    ends: list[int] = []
    count = total = 0
    for index, size in enumerate(sizes):
        if count and (count == page_size or total + size > PAGE_BYTES):
            ends.append(index)
            count = total = 0
        count += 1
        total += size
    ends.append(len(sizes))
    return tuple(ends)


def _listed(part: Part | None, names: Sequence[str]) -> dict[str, types.Tool]:
    return {n: part.listed[n] for n in names} if part is not None else {}


def _policy(client: Principal | None) -> str | None:
    return client.policy_key if client is not None else None


_PLACE = re.compile(r"tools:(0|[1-9][0-9]*)(?::(0|[1-9][0-9]*):(.+))?", re.DOTALL)
"""As ``_cursor`` writes it (``tools:N`` before walks were resumed by name): digits as
written, as int() reads Arabic-Indic or full-width digits, "03" too."""


def _cursor(place: Place) -> str:
    return base64.urlsafe_b64encode(f"tools:{place.offset}:{place.version}:{place.key}".encode()).decode()


def _place(cursor: str | None) -> Place:
    """What a cursor this gateway issued says (the start for no cursor).

    Raises:
        MCPError: the cursor is not one of ours (INVALID_PARAMS, as the spec asks).
    """
    if cursor is None:
        return Place(0)
    try:
        read = _PLACE.fullmatch(base64.urlsafe_b64decode(cursor.encode()).decode())
    except (binascii.Error, UnicodeError, ValueError):
        read = None
    if read is None:
        raise to_wire(InvalidRequest("invalid cursor for tools/list"))
    offset, version, name = read.groups()
    return Place(int(offset), int(version) if version is not None else None, name)
