"""The catalog's tools, searchable: an index kept in step with the catalog, one upstream at a time,
and searches that return only what the asker may call.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from agent_gateway.catalog import CatalogChange, CatalogSnapshot, Part
from agent_gateway.catalog_parts import counted
from agent_gateway.config import EmbeddingsConfig
from agent_gateway.runtime import CLEANUP_TIMEOUT
from agent_gateway.search.dense import DenseIndex, Embedder, EmbeddingsFailed
from agent_gateway.search.index import Document, ToolIndex
from agent_gateway.search.text import words
from agent_gateway.search.turns import Turns

logger = logging.getLogger(__name__)

Accept = Callable[[str], bool]
"""Whether the asker may call a tool, by public name."""
T = TypeVar("T")
INDEXING = "(indexing)"
"""The party of the index's own updates, in turn with the searches."""


@dataclass(frozen=True, slots=True)
class Found:
    """One search result: the tool as clients see it, its upstream, and how well it matches."""

    tool: types.Tool
    upstream: str
    score: float


class ToolSearch:
    """Searches the current catalog's tools. Use ``async with search.running():`` (it indexes
    the tools listed at start-up in a worker thread, and embeds tool texts in the background
    when dense retrieval is configured); search only once ``load`` has returned.

    Once loaded, each search and each upstream's re-indexing runs in a worker thread, one at a
    time: a search of many common words costs a third of a second at 10,000 tools when their
    postings are not cached (``bench/README.md``), which other clients' requests must not wait
    out on the event loop."""

    def __init__(self, embeddings: EmbeddingsConfig | None = None) -> None:
        """Raises ``ConfigError`` when ``embeddings`` is set and numpy is not installed."""
        self._index = ToolIndex()
        self._config = embeddings
        self._dense = DenseIndex() if embeddings is not None else None
        self._embedder: Embedder | None = None
        self._stale: dict[str, Part | None] = {}
        self._prepared: dict[str, Part] = {}
        self._arrivals: MemoryObjectSendStream[Part] | None = None
        self._arrived = anyio.Event()
        self._loaded = anyio.Event()
        """Set while no start-up indexing is pending: changes wait for it (see ``changed``)."""
        self._loaded.set()
        self._wake = anyio.Event()
        self._quiet_until = 0.0
        self._turns = Turns()
        """The index's one user at a time (SQLite's connection and the postings kept)."""

    async def _indexed(self, operation: Callable[[], T], party: Hashable = INDEXING) -> T:
        """``operation`` on the index, in a worker thread, when no other is under way; after
        each of ``party``'s operations before it, but behind at most one of any other's."""
        async with self._turns.taken(party):
            return await anyio.to_thread.run_sync(operation)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ToolSearch]:
        """Enter before the upstreams connect: the parts ``prepare`` is given are indexed in a
        worker thread meanwhile."""
        self._embedder = Embedder(self._config) if self._config is not None else None
        self._arrivals, arrivals = anyio.create_memory_object_stream[Part](math.inf)
        self._arrived, self._loaded = anyio.Event(), anyio.Event()
        try:
            async with self._arrivals, anyio.create_task_group() as tg:  # closed by load, or here
                tg.start_soon(self._index_arrivals, arrivals, name="tool index: start-up")
                if self._dense is not None and self._embedder is not None:
                    tg.start_soon(self._embed_changes, self._dense, self._embedder)
                yield self
                tg.cancel_scope.cancel()
        finally:
            self._arrivals = None
            self._loaded.set()  # no load is coming: let any waiting change through
            if self._embedder is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
                    await self._embedder.aclose()
            self._embedder = None

    async def _index_arrivals(self, arrivals: MemoryObjectReceiveStream[Part]) -> None:
        """Index the parts built at start-up in a worker thread, in the order they came: most
        of it is SQLite's, which runs without the GIL, and the event loop stays free for the
        upstreams still connecting."""
        async with arrivals:
            async for part in arrivals:
                await anyio.to_thread.run_sync(self._index.replace, part.upstream, documents(part))
        self._arrived.set()

    def embedded(self, tools: int) -> bool:
        """Whether dense retrieval holds a vector for each of ``tools`` tools (benchmarks, tests)."""
        return self._dense is not None and not self._stale and len(self._dense) >= tools

    def prepare(self, part: Part) -> None:
        """Index ``part`` ahead of ``load``, while other upstreams still connect (start-up):
        in the worker thread while ``running`` and not loaded yet, else here."""
        if self._arrivals is not None:
            self._arrivals.send_nowait(part)
        else:
            self._index.replace(part.upstream, documents(part))
        self._prepared[part.upstream] = part

    async def load(self, snapshot: CatalogSnapshot) -> None:
        """Index every part of ``snapshot`` not indexed as it was by ``prepare`` (start-up),
        once the worker thread has indexed those; the index is the event loop's from then on."""
        started = time.perf_counter()
        if self._arrivals is not None:
            self._arrivals.close()
            self._arrivals = None
            await self._arrived.wait()  # bounded: the parts already listed, nothing external
        early = 0
        for upstream in self._prepared.keys() - snapshot.parts.keys():
            self._index.remove(upstream)
        for part in snapshot.parts.values():
            if self._prepared.get(part.upstream) is part:
                early += 1
            else:
                self._index.replace(part.upstream, documents(part))
            self._restale(part.upstream, part)
        self._prepared.clear()
        self._loaded.set()
        logger.info(
            "tool index ready: %s from %s (%d indexed as they connected) in %.0f ms",
            counted(len(self._index), "tool"),
            counted(len(snapshot.parts), "upstream"),
            early,
            (time.perf_counter() - started) * 1e3,
        )

    async def changed(self, change: CatalogChange) -> None:
        """Catalog listener: re-index the upstreams whose part changed.

        A change made while ``load`` waits for the start-up indexing (the catalog is live by
        then) waits for it too: applied first, it would be undone by the older part the worker
        or ``load`` indexes after it, and it would touch the index from a second thread.
        """
        await self._loaded.wait()
        for upstream in change.upstreams:
            part = change.after.parts.get(upstream)
            if part is None:
                await self._indexed(partial(self._index.remove, upstream))
            elif part is not change.before.parts.get(upstream):
                await self._indexed(partial(self._index.replace, upstream, documents(part)))
            else:
                continue
            self._restale(upstream, part)

    def _restale(self, upstream: str, part: Part | None) -> None:
        if self._dense is not None:
            self._stale[upstream] = part
            self._wake.set()

    async def _embed_changes(self, dense: DenseIndex, embedder: Embedder) -> None:
        """Embed the tools of each changed upstream, newest listing only, retrying with backoff."""
        delay = _RETRY_FIRST
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._stale:
                upstream, part = next(iter(self._stale.items()))
                try:
                    await _embed(dense, embedder, upstream, part)
                except EmbeddingsFailed as exc:
                    logger.warning("tool embeddings for %s: %s; retrying in %.0fs", upstream, exc, delay)
                    await anyio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MOST)
                    continue
                delay = _RETRY_FIRST
                if self._stale.get(upstream) is part:  # not changed again meanwhile
                    del self._stale[upstream]

    async def search(
        self,
        snapshot: CatalogSnapshot,
        query: str,
        limit: int,
        *,
        upstream: str | None = None,
        accept: Accept | None = None,
        party: Hashable = None,
    ) -> tuple[list[Found], int]:
        """The ``limit`` tools of ``snapshot`` best matching ``query``, best first, of those
        ``accept`` takes (and of ``upstream`` only, when given); and how many matched in all.
        ``party``: who searches (a client), for its turn at the index (``search/turns.py``)."""
        pool = max(limit, _FUSED) if self._dense is not None else limit
        results = await self._indexed(
            partial(self._index.search, query, limit=pool, upstream=upstream, accept=accept), party
        )
        ranked = [(hit.key, hit.upstream, hit.score) for hit in results.hits]
        dense = _weighted(await self._nearest(query, upstream, accept), snapshot)
        if dense:
            ranked = _fused(ranked, dense, snapshot)
        found = [
            Found(snapshot.listed[key], upstream, round(score, 4))
            for key, upstream, score in ranked[:limit]
            if key in snapshot.listed  # the index may trail a change by one update
        ]
        return found, max(results.total, len(ranked))

    async def _nearest(
        self, query: str, upstream: str | None, accept: Accept | None
    ) -> list[tuple[str, float, float]]:
        if self._dense is None or self._embedder is None or not len(self._dense) or not query.strip():
            return []
        try:
            vector = await self._embedder.query(query)
        except EmbeddingsFailed as exc:
            if time.monotonic() >= self._quiet_until:  # one line a minute, not one per search
                logger.warning("tool search without embeddings: %s", exc)
                self._quiet_until = time.monotonic() + 60
            return []
        return self._dense.nearest(vector, _FUSED, upstream, accept)


async def _embed(dense: DenseIndex, embedder: Embedder, upstream: str, part: Part | None) -> None:
    if part is None:
        dense.remove(upstream)
        return
    docs = list(documents(part))
    started = time.perf_counter()
    vectors = await embedder.embed([embedding_text(d) for d in docs])
    dense.replace(upstream, [d.key for d in docs], vectors)
    logger.info(
        "tool embeddings for %s: %d tools in %.0f ms",
        upstream,
        len(docs),
        (time.perf_counter() - started) * 1e3,
    )


def _weighted(
    dense: list[tuple[str, float, float]], snapshot: CatalogSnapshot
) -> list[tuple[str, float, float]]:
    """``dense``'s matches scaled by their upstream's ``search_weight`` (the lexical index
    scales its own), best first; none of an upstream weighted 0."""
    weights = {p.upstream: p.search_weight for p in snapshot.parts.values() if p.search_weight != 1.0}
    if not weights or not dense:
        return dense
    kept: list[tuple[str, float, float]] = []
    for key, cosine, confidence in dense:
        weight = weights.get(tool.upstream, 1.0) if (tool := snapshot.tools.get(key)) else 1.0
        if weight > 0.0:
            kept.append((key, cosine * weight, confidence * weight))
    return sorted(kept, key=lambda match: -match[1])


def _fused(
    lexical: list[tuple[str, str, float]], dense: list[tuple[str, float, float]], snapshot: CatalogSnapshot
) -> list[tuple[str, str, float]]:
    """Both rankings combined by standardized score: in each, how many standard deviations a
    tool stands above that ranking's candidates, the two added. The lexical scores spread over
    0..1 and cosines sit in a narrow band, so neither scale means anything to the other;
    standardized, each says how far a tool stands out where it was ranked, which ranks alone
    (reciprocal rank fusion, before) do not (``bench/README.md``, "fused by how far each tool
    stands out": recall@5 0.77 -> 0.79, held-out half 0.74 -> 0.75). A tool the words did not
    match scores 0 there, and counts among the lexical candidates as such (so a lone match
    still stands out); one outside the nearest gets the farthest's standing. A spread under a
    ranking's ``_LEAST_SPREAD`` counts as that much: among a few candidates (one upstream's,
    a narrow policy's) a hair's difference is not several deviations. Each tool keeps the
    better of its two scores as its own: the lexical one, or how far its similarity stands out."""
    score: dict[str, float] = {}
    upstream_of: dict[str, str] = {}
    for key, upstream, lexical_score in lexical:
        score[key], upstream_of[key] = lexical_score, upstream
    meaning: dict[str, float] = {}
    for key, cosine, confidence in dense:
        if key in snapshot.tools:
            meaning[key] = cosine
            score[key] = max(score.get(key, 0.0), confidence)
            upstream_of.setdefault(key, snapshot.tools[key].upstream)
    by_words, unmatched = _standardized([s for _, _, s in lexical], 0.0, _LEAST_SPREAD_WORDS)
    by_meaning, farthest = _standardized(
        list(meaning.values()), min(meaning.values(), default=0.0), _LEAST_SPREAD_MEANING
    )
    fused = dict.fromkeys(upstream_of, unmatched + farthest)
    for (key, _, _), standing in zip(lexical, by_words, strict=True):
        fused[key] += standing - unmatched
    for key, standing in zip(meaning, by_meaning, strict=True):
        fused[key] += standing - farthest
    order = sorted(fused, key=lambda k: (-fused[k], k))
    return [(key, upstream_of[key], score[key]) for key in order]


def _standardized(scores: list[float], floor: float, least_spread: float) -> tuple[list[float], float]:
    """Each score, and ``floor`` (the score of whatever was not returned), as standard
    deviations (at least ``least_spread``) from the mean of ``scores`` and ``floor`` together."""
    values = [*scores, floor]
    mean = math.fsum(values) / len(values)
    spread = max(math.sqrt(math.fsum((s - mean) ** 2 for s in values) / len(values)), least_spread)
    return [(s - mean) / spread for s in scores], (floor - mean) / spread


_LEAST_SPREAD_WORDS = 0.05
"""Of lexical scores (0..1); with ``_LEAST_SPREAD_MEANING``, of cosines: neither changes a
result on the benchmark (its rankings' spreads are larger), both keep a few candidates' hair
from counting as deviations."""
_LEAST_SPREAD_MEANING = 0.02
_FUSED = 50
"""Candidates taken from each ranking before they are fused."""
_RETRY_FIRST = 1.0
_RETRY_MOST = 60.0


def embedding_text(document: Document) -> str:
    """What is embedded for a tool: its upstream, name in words, title and description."""
    name = " ".join(words(document.name))
    parts = [f"{document.server}: {name}.", document.title, document.description[:_EMBEDDED_CHARS]]
    return " ".join(p for p in parts if p)


_EMBEDDED_CHARS = 600
_NAME_CHARS = 128
"""Of an upstream's own name for a tool, what is indexed: MCP's longest name. The name is the
heaviest field: a tool named with 3,000 words was found first for any request holding one."""


def documents(part: Part) -> Iterator[Document]:
    """``part``'s tools as the index reads them."""
    instructions = part.listing.instructions or ""
    for public, origin in part.tools.items():
        tool = origin.item
        title = tool.title or (tool.annotations.title if tool.annotations else None) or ""
        own = origin.name[:_NAME_CHARS]
        yield Document(
            key=public,
            upstream=part.upstream,
            # The name clients call it by, and the upstream's own (its description's word for it)
            name=f"{renamed} {own}" if (renamed := part.renamed.get(public)) else own,
            title=title,
            description=tool.description or "",
            params=" ".join(_parameters(tool.input_schema)),
            server=part.upstream,
            instructions=instructions,
            weight=part.search_weight,
        )


def _parameters(schema: Mapping[str, Any], depth: int = 0) -> Iterator[str]:
    """Parameter names and descriptions, one level into nested objects. Schemas are parsed
    JSON, so plain dicts are checked for (an ABC check per parameter showed in the start-up
    profile)."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    for name, spec in properties.items():  # pyright: ignore[reportUnknownVariableType]
        yield str(name)  # pyright: ignore[reportUnknownArgumentType]
        if isinstance(spec, dict):
            if isinstance(description := spec.get("description"), str):  # pyright: ignore[reportUnknownMemberType]
                yield description
            if depth == 0:
                yield from _parameters(spec, depth + 1)  # pyright: ignore[reportUnknownArgumentType]
