"""``prompts/list``, ``resources/list`` and ``resources/templates/list``, page by page: each
client's list is made once per catalog version and policy, and a page is a slice of it.

FastMCP's own handlers listed everything the client may see, and made each item a wire model,
for every page, to send ``server.page_size`` of them: at 3,000 prompts a page of ten took 50 ms
of the event loop (O(catalog) a page, so a client walking the list cost O(catalog²), every
other client waiting). The lists, their order and their cursors are those FastMCP's handlers
made; only the current catalog version's are kept (one per list and policy).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mcp_types as types
from fastmcp import FastMCP
from fastmcp.utilities.pagination import CursorState
from fastmcp.utilities.versions import dedupe_with_versions
from mcp.server.lowlevel import Server
from pydantic import BaseModel

from agent_gateway import access
from agent_gateway.catalog import Catalog
from agent_gateway.downstream.sessions import SessionRegistry
from agent_gateway.errors import InvalidRequest, to_wire
from agent_gateway.list_walks import Place, resumed
from agent_gateway.listing import page_ends

Build = Callable[[], Awaitable[Sequence[BaseModel]]]


@dataclass(frozen=True)
class _Paged:
    """One client's list in one catalog version, and where its pages end: after
    ``server.page_size`` items, or before their JSON would pass ``listing.PAGE_BYTES`` (one
    item at least), as ``tools/list``'s."""

    version: int
    items: Sequence[BaseModel]
    ends: tuple[int, ...]
    identity: Callable[[Any], str]
    """An item's name (prompts) or URI (resources, templates), unique in the list."""

    @classmethod
    def of(
        cls, version: int, items: Sequence[BaseModel], page_size: int, identity: Callable[[Any], str]
    ) -> _Paged:
        sizes = [len(item.model_dump_json(by_alias=True, exclude_none=True)) for item in items]
        return cls(version, items, page_ends(sizes, page_size), identity)

    def page(self, start: int) -> tuple[Sequence[BaseModel], str | None]:
        """The page starting at ``start``, and the cursor of the next (None: the last)."""
        end = self.ends[bisect.bisect_right(self.ends, start)] if start < len(self.items) else start
        last = _digest(self.identity(self.items[end - 1])) if end < len(self.items) else ""
        following = _cursor(Place(end, self.version, last)) if last else None
        return self.items[start:end], following

    def __len__(self) -> int:
        return len(self.items)

    def key(self, index: int) -> str:
        return self._keys[index]

    def position(self, key: str) -> int | None:
        return self._positions.get(key)

    @cached_property
    def _keys(self) -> Sequence[str]:
        return [_digest(self.identity(item)) for item in self.items]

    @cached_property
    def _positions(self) -> Mapping[str, int]:
        """Made only for a cursor of a version since changed (``list_walks``)."""
        return {key: index for index, key in enumerate(self._keys)}


def _digest(identity: str) -> str:
    """A cursor names an item by this: a URI may be 8,192 characters, a cursor 256."""
    return base64.urlsafe_b64encode(hashlib.blake2b(identity.encode(), digest_size=12).digest()).decode()


def _cursor(place: Place) -> str:
    """FastMCP's cursor (``{"o": offset}``), with the version and the last item's key."""
    text = json.dumps({"o": place.offset, "v": place.version, "k": place.key})
    return base64.urlsafe_b64encode(text.encode()).decode()


def _place(cursor: str | None) -> Place:
    """Raises ValueError for a cursor neither FastMCP's nor this gateway's."""
    if not cursor:
        return Place(0)
    offset = CursorState.decode(cursor).offset  # FastMCP's checks: a whole count
    read = json.loads(base64.urlsafe_b64decode(cursor.encode()))  # as it just read it
    version, key = read.get("v"), read.get("k")
    if version is None and key is None:  # FastMCP's own
        return Place(offset)
    if type(version) is not int or version < 0 or not isinstance(key, str):
        raise ValueError("not a cursor of this gateway's")
    return Place(offset, version, key)


class ComponentLists:
    """The three lists FastMCP answered, answered from a list made once per catalog version
    and policy (``access.visible``, in the catalog provider, is still what filters it)."""

    METHODS = frozenset({"prompts/list", "resources/list", "resources/templates/list"})
    """Served here: FastMCP's root middleware is skipped for them (``compat.fastmcp``)."""

    def __init__(
        self, server: FastMCP[Any], catalog: Catalog, sessions: SessionRegistry, page_size: int
    ) -> None:
        self._server = server
        self._catalog = catalog
        self._sessions = sessions
        self._page_size = page_size
        self._lists: dict[tuple[str, int, str | None], _Paged] = {}

    def register(self, lowlevel: Server[Any]) -> None:
        """Serve the three lists in place of FastMCP's handlers."""
        lowlevel.add_request_handler("prompts/list", types.PaginatedRequestParams, self.prompts)
        lowlevel.add_request_handler("resources/list", types.PaginatedRequestParams, self.resources)
        lowlevel.add_request_handler("resources/templates/list", types.PaginatedRequestParams, self.templates)

    async def prompts(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        page, following = await self._page(ctx, params, "prompts/list", self._prompts)
        return types.ListPromptsResult(prompts=list(page), next_cursor=following)

    async def resources(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        page, following = await self._page(ctx, params, "resources/list", self._resources)
        return types.ListResourcesResult(resources=list(page), next_cursor=following)

    async def templates(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        page, following = await self._page(ctx, params, "resources/templates/list", self._templates)
        return types.ListResourceTemplatesResult(resource_templates=list(page), next_cursor=following)

    async def _page(
        self, ctx: Any, params: types.PaginatedRequestParams | None, method: str, build: Build
    ) -> tuple[Sequence[Any], str | None]:
        """The page the request's cursor points at (FastMCP's cursors, read as its handlers
        read them; one not of their form is ``-32602``, the cursor not sent back)."""
        async with self._sessions.serving(ctx):  # once, as the pipeline's methods are
            client = access.current()
            key = (method, self._catalog.snapshot.version, client.policy_key if client is not None else None)
            if (paged := self._lists.get(key)) is None:
                paged = _Paged.of(key[1], await build(), self._page_size, _IDENTITIES[method])
                self._lists = {k: v for k, v in self._lists.items() if k[1] in self._kept(key[1])}
                self._lists[key] = paged
        try:
            place = _place(params.cursor if params is not None else None)
        except ValueError as exc:  # not one of FastMCP's, nor of this gateway's
            raise to_wire(InvalidRequest(f"invalid cursor for {method}")) from exc
        then = self._lists.get((method, place.version, key[2])) if place.version is not None else None
        return paged.page(resumed(place, paged, then))

    def _kept(self, version: int) -> set[int]:
        """The versions whose lists are kept: ``version``'s, and the last before it (a walk
        begun in it goes on from its last item still listed: ``list_walks``)."""
        older = [v for _, v, _ in self._lists if v < version]
        return {version, max(older)} if older else {version}

    async def _prompts(self) -> Sequence[types.Prompt]:
        listed = dedupe_with_versions(list(await self._server.list_prompts(run_middleware=False)), _name)
        return [p.to_mcp_prompt(name=p.name) for p in listed]

    async def _resources(self) -> Sequence[types.Resource]:
        listed = await self._server.list_resources(run_middleware=False)
        return [r.to_mcp_resource(uri=str(r.uri)) for r in dedupe_with_versions(list(listed), _uri)]

    async def _templates(self) -> Sequence[types.ResourceTemplate]:
        listed = await self._server.list_resource_templates(run_middleware=False)
        deduped = dedupe_with_versions(list(listed), _template)
        return [t.to_mcp_template(uri_template=t.uri_template) for t in deduped]


def _name(component: Any) -> str:
    return component.name


def _uri(component: Any) -> str:
    return str(component.uri)


def _template(component: Any) -> str:
    return component.uri_template


_IDENTITIES: dict[str, Callable[[Any], str]] = {
    "prompts/list": _name,
    "resources/list": _uri,
    "resources/templates/list": _template,
}
