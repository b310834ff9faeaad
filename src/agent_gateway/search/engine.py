"""The catalog's tools, searchable: an index kept in step with the catalog, one upstream at a time,
and searches that return only what the asker may call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from agent_gateway.catalog import CatalogChange, CatalogSnapshot, Part
from agent_gateway.search.index import Document, ToolIndex

logger = logging.getLogger(__name__)

Accept = Callable[[str], bool]
"""Whether the asker may call a tool, by public name."""


@dataclass(frozen=True, slots=True)
class Found:
    """One search result: the tool as clients see it, its upstream, and how well it matches."""

    tool: types.Tool
    upstream: str
    score: float


class ToolSearch:
    """Searches the current catalog's tools."""

    def __init__(self) -> None:
        self._index = ToolIndex()

    def load(self, snapshot: CatalogSnapshot) -> None:
        """Index every part of ``snapshot`` (start-up)."""
        started = time.perf_counter()
        for part in snapshot.parts.values():
            self._index.replace(part.upstream, documents(part))
        logger.info(
            "tool index ready: %d tools from %d upstreams in %.0f ms",
            len(self._index),
            len(snapshot.parts),
            (time.perf_counter() - started) * 1e3,
        )

    async def changed(self, change: CatalogChange) -> None:
        """Catalog listener: re-index the upstreams whose part changed."""
        for upstream in change.upstreams:
            part = change.after.parts.get(upstream)
            if part is None:
                self._index.remove(upstream)
            elif part is not change.before.parts.get(upstream):
                self._index.replace(upstream, documents(part))

    async def search(
        self,
        snapshot: CatalogSnapshot,
        query: str,
        limit: int,
        *,
        upstream: str | None = None,
        accept: Accept | None = None,
    ) -> tuple[list[Found], int]:
        """The ``limit`` tools of ``snapshot`` best matching ``query``, best first, of those
        ``accept`` takes (and of ``upstream`` only, when given); and how many matched in all."""
        results = self._index.search(query, limit=limit, upstream=upstream, accept=accept)
        found = [
            Found(snapshot.listed[hit.key], hit.upstream, round(hit.score, 4))
            for hit in results.hits
            if hit.key in snapshot.listed  # the index may trail a change by one update
        ]
        return found, results.total


def documents(part: Part) -> Iterator[Document]:
    """``part``'s tools as the index reads them."""
    instructions = part.listing.instructions or ""
    for public, origin in part.tools.items():
        tool = origin.item
        title = tool.title or (tool.annotations.title if tool.annotations else None) or ""
        yield Document(
            key=public,
            upstream=part.upstream,
            name=origin.name,
            title=title,
            description=tool.description or "",
            params=" ".join(_parameters(tool.input_schema)),
            server=part.upstream,
            instructions=instructions,
        )


def _parameters(schema: Mapping[str, Any], depth: int = 0) -> Iterator[str]:
    """Parameter names and descriptions, one level into nested objects."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return
    for name, spec in properties.items():  # pyright: ignore[reportUnknownVariableType]
        yield str(name)  # pyright: ignore[reportUnknownArgumentType]
        if isinstance(spec, Mapping):
            if isinstance(description := spec.get("description"), str):  # pyright: ignore[reportUnknownMemberType]
                yield description
            if depth == 0:
                yield from _parameters(spec, depth + 1)  # pyright: ignore[reportUnknownArgumentType]
