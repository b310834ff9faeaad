"""What an upstream lists, fetched: every page of each list its capabilities say it has,
within the bounds of what the gateway takes from one upstream (``catalog_parts``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import mcp_types as types
import msgspec
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent_gateway.catalog_parts import (
    MAX_ITEM_BYTES,
    MAX_LISTED,
    MAX_LISTED_BYTES,
    Listed,
    Listing,
    kept_instructions,
    rest_size,
)
from agent_gateway.compat.mcp import PageTooLong
from agent_gateway.errors import UpstreamRejected, shown

logger = logging.getLogger(__name__)

_PAGE_CAP = 1000
T = TypeVar("T", bound=Listed)


async def fetch_listing(client: Client, upstream: str) -> Listing:
    """Everything ``upstream`` lists, all pages, for what its capabilities say it has.

    Raises:
        UpstreamRejected: one of its lists holds more than ``MAX_LISTED`` items, or more than
            ``MAX_LISTED_BYTES`` of JSON (names, descriptions, schemas, ...).
    """
    caps = client.server_capabilities
    pages = _Pages(upstream)
    return Listing(
        tools=await pages.all(client.list_tools, lambda r: r.tools, "tools", _schemas_size)
        if caps.tools
        else (),
        prompts=await pages.all(client.list_prompts, lambda r: r.prompts, "prompts") if caps.prompts else (),
        resources=(
            await pages.all(client.list_resources, lambda r: r.resources, "resources")
            if caps.resources
            else ()
        ),
        templates=await _templates(client, pages) if caps.resources else (),
        instructions=kept_instructions(client.instructions, upstream),
        protocol_version=client.protocol_version,
    )


async def _templates(client: Client, pages: _Pages) -> tuple[types.ResourceTemplate, ...]:
    """Its resource templates; none when it answers Method not found, as the SDK's low-level
    server given no templates handler does (taken for down before, with all its tools)."""
    try:
        return await pages.all(
            client.list_resource_templates, lambda r: r.resource_templates, "resource templates"
        )
    except MCPError as exc:
        if exc.code != types.METHOD_NOT_FOUND:
            raise
        logger.debug("upstream %s has no resources/templates/list (%s): no templates", pages.upstream, exc)
        return ()


@dataclass(frozen=True)
class _Pages:
    upstream: str

    async def all(
        self,
        fetch: Callable[..., Awaitable[Any]],
        items: Callable[[Any], list[T]],
        kind: str,
        schemas: Callable[[T], int] = lambda item: 0,
    ) -> tuple[T, ...]:
        """Every page of one list, within the bounds (see ``fetch_listing``), but the items
        that hold more than ``MAX_ITEM_BYTES`` besides a tool's schemas (left out, said once)."""
        collected: list[T] = []
        oversized: list[T] = []
        held = 0
        cursor: str | None = None
        asked: set[str] = set()
        for _ in range(_PAGE_CAP):
            try:
                page = await fetch(cursor=cursor)
            except PageTooLong:  # refused before its items were made models
                raise self._refused(kind) from None
            for item in items(page):
                rest = rest_size(item)
                held += rest + schemas(item)
                (collected if rest <= MAX_ITEM_BYTES else oversized).append(item)
            if len(collected) + len(oversized) > MAX_LISTED or held > MAX_LISTED_BYTES:
                raise self._refused(kind)
            asked.add(cursor or "")
            if not (cursor := page.next_cursor) or cursor in asked:
                break
        if cursor:  # one line per listing
            why = (
                "names a page already read: its list loops"
                if cursor in asked
                else f"is past {_PAGE_CAP} pages"
            )
            logger.warning("upstream %s: its %s read up to a nextCursor that %s", self.upstream, kind, why)
        if oversized:  # one line per listing: the upstream chooses how many
            logger.warning(
                "upstream %s: %d %s not listed: each holds over %d bytes besides a tool's schemas (%s)",
                *(self.upstream, len(oversized), kind, MAX_ITEM_BYTES, shown(oversized[0].name)),
            )
        return tuple(collected)

    def _refused(self, kind: str) -> UpstreamRejected:
        return UpstreamRejected(
            self.upstream,
            f"its {kind} are more than the gateway takes from one upstream ({MAX_LISTED:,} "
            f"items, {MAX_LISTED_BYTES // 2**20} MiB of names, descriptions and schemas): refused",
            types.INTERNAL_ERROR,
        )


def _schemas_size(tool: types.Tool) -> int:
    schemas = (tool.input_schema, tool.output_schema)
    return sum(len(msgspec.json.encode(s)) for s in schemas if s is not None)
