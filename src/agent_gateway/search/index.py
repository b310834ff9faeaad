"""The lexical tool index: BM25 over each tool's fields, in SQLite's FTS5, updated per upstream.

SQLite's FTS5 (in Python's standard library) holds the index and scores it with its own BM25,
with a weight per field: the tool's name counts most, then its title, its upstream's name, its
description, its parameters and its upstream's instructions. Text is analysed here
(``text.terms``: identifiers split, stop words dropped, Snowball stems) and stored as stems, so
queries and documents are analysed alike. One upstream's change replaces only its rows.

A query runs twice: its own terms, and the terms the thesaurus relates to them (at
``SYNONYM_WEIGHT``); the two scores add. The score returned is that sum over the most the
query's own terms could score (every term matched, BM25 saturated), cut to [0, 1]: it says
how much of the request a tool matches, so a caller can tell a weak match from a strong one.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from agent_gateway.search.text import terms
from agent_gateway.search.thesaurus import Thesaurus

FIELDS = ("name", "title", "description", "params", "server", "instructions")
WEIGHTS = (6.0, 3.0, 2.0, 1.0, 3.0, 0.3)
"""BM25 weights per field (FTS5 multiplies each field's term frequency by its weight)."""
_K1 = 1.2  # FTS5's own BM25 parameters
_CANDIDATES = 200
"""Rows taken from each of a query's two runs before they are merged and filtered."""
_COMMON = 0.1
"""An expansion term found in more than this share of all tools says too little to run."""
SYNONYM_WEIGHT = 0.5
"""How much a word the query did not use counts, against one it did."""
COORD_BASE = 1.0
"""Rerank: a tool covering none of the request keeps half its BM25 score, all of it, all."""
NAME_WEIGHT = 0.2
"""Rerank: what a tool whose name the request explains word for word gains (scores are 0..1)."""
_RERANKED = 60
"""The candidates, best by BM25, that the coverage rerank reorders."""
_FEW = 50
"""Below this many rows a term is never too common to expand with (a small index is cheap)."""
_EXPANSIONS = 8
"""The rarest related terms a query is expanded with (each costs a pass over its rows)."""


@dataclass(frozen=True, slots=True)
class Document:
    """One tool as the index reads it (plain text; ``terms`` analyses it)."""

    key: str
    """The tool's public name."""
    upstream: str
    name: str
    title: str = ""
    description: str = ""
    params: str = ""
    server: str = ""
    instructions: str = ""

    def fields(self) -> tuple[str, ...]:
        return (self.name, self.title, self.description, self.params, self.server, self.instructions)


@dataclass(frozen=True, slots=True)
class _Row:
    key: str
    upstream: str


@dataclass(frozen=True, slots=True)
class Hit:
    key: str
    upstream: str
    score: float
    """How much of the query this tool matches, 0 (nothing) to 1."""


@dataclass(frozen=True, slots=True)
class Results:
    hits: list[Hit]
    total: int
    """Every tool that matched the query at all (before ``limit``)."""


class ToolIndex:
    """BM25 over tool documents; rows are replaced one upstream at a time."""

    def __init__(self, thesaurus: Thesaurus | None = None) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        columns = ", ".join([*FIELDS, "upstream UNINDEXED"])
        self._db.execute(f"CREATE VIRTUAL TABLE tools USING fts5({columns}, tokenize='unicode61')")
        # The weights become the table's ``rank``: ORDER BY rank is then the weighted BM25.
        weights = ", ".join(str(w) for w in WEIGHTS)
        self._db.execute("INSERT INTO tools(tools, rank) VALUES ('rank', ?)", (f"bm25({weights})",))
        self._thesaurus = thesaurus or Thesaurus()
        self._rows: dict[int, _Row] = {}
        """(public name, upstream) by rowid: the text itself lives only in SQLite."""
        self._of_upstream: dict[str, list[int]] = {}
        self._df: Counter[str] = Counter()
        self._terms: dict[int, frozenset[str]] = {}
        self._names: dict[int, frozenset[str]] = {}
        self._next = 1

    def __len__(self) -> int:
        return len(self._rows)

    def replace(self, upstream: str, documents: Iterable[Document]) -> None:
        """Make ``documents`` the whole of ``upstream``'s part of the index."""
        self.remove(upstream)
        rows: list[tuple[object, ...]] = []
        ids: list[int] = []
        for document in documents:
            analysed = [_analysed(text) for text in document.fields()]
            rowid, self._next = self._next, self._next + 1
            rows.append((rowid, *analysed, upstream))
            ids.append(rowid)
            self._rows[rowid] = _Row(document.key, upstream)
            unique = frozenset(t for text in analysed for t in text.split())
            self._terms[rowid] = unique
            self._names[rowid] = frozenset(analysed[0].split())
            self._df.update(unique)
        placeholders = ", ".join("?" * (len(FIELDS) + 2))
        self._db.executemany(
            f"INSERT INTO tools(rowid, {', '.join(FIELDS)}, upstream) VALUES ({placeholders})", rows
        )
        self._of_upstream[upstream] = ids

    def remove(self, upstream: str) -> None:
        """Take ``upstream``'s rows out of the index."""
        ids = self._of_upstream.pop(upstream, [])
        if not ids:
            return
        self._db.executemany("DELETE FROM tools WHERE rowid = ?", [(i,) for i in ids])
        for rowid in ids:
            del self._rows[rowid]
            del self._names[rowid]
            for term in self._terms.pop(rowid):
                self._df[term] -= 1
                if not self._df[term]:
                    del self._df[term]

    def search(
        self,
        query: str,
        *,
        limit: int,
        upstream: str | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> Results:
        """The ``limit`` best tools for ``query``, best first; only those ``accept`` takes
        (by public name) and, given ``upstream``, only that upstream's."""
        own = sorted(set(terms(query)))
        if not own or not self._rows:
            return Results([], 0)
        scores: dict[int, float] = defaultdict(float)
        related = self._related(own)
        own_top = self._run(own, upstream, accept)
        related_top = self._run(related, upstream, accept)
        for weight, top in ((1.0, own_top), (SYNONYM_WEIGHT, related_top)):
            for rowid, score in top:
                scores[rowid] += weight * score
        best = self._bound(own)
        weights = {t: _idf(len(self._rows), self._df[t]) for t in own}
        wanted = dict.fromkeys(related, SYNONYM_WEIGHT) | dict.fromkeys(own, 1.0)
        # Only the best by BM25 are reranked: the rerank reorders them, it does not search.
        leaders = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[: max(_RERANKED, limit)]
        final = {r: self._reranked(r, s / best, weights, wanted) for r, s in leaders}
        ranked = sorted(final.items(), key=lambda item: (-item[1], item[0]))[:limit]
        hits = [Hit(self._rows[r].key, self._rows[r].upstream, min(1.0, score)) for r, score in ranked]
        return Results(hits, self._matched(own, upstream, accept, [r for r, _ in related_top]))

    def _reranked(
        self, rowid: int, score: float, weights: dict[str, float], wanted: dict[str, float]
    ) -> float:
        """``score`` adjusted by how much of the request the tool covers (BM25 alone lets one
        rare word outweigh the rest) and how much of the tool's name the request explains.

        ``weights``: the IDF of each of the query's own terms; ``wanted``: what a name term
        found in the query (1) or among its related terms (``SYNONYM_WEIGHT``) is worth.
        """
        held = self._terms[rowid]
        coord = sum(w for t, w in weights.items() if t in held) / (sum(weights.values()) or 1.0)
        name = self._names[rowid]
        explained = sum(wanted.get(t, 0.0) for t in name) / (len(name) or 1)
        return score * (COORD_BASE + coord) / (COORD_BASE + 1) + NAME_WEIGHT * explained

    def _related(self, own: list[str]) -> list[str]:
        """The thesaurus's terms for ``own`` that some tool holds, rarest first, at most
        ``_EXPANSIONS``: a term most tools hold tells them apart no better than none."""
        limit = max(_COMMON * len(self._rows), _FEW)
        related = [t for t in self._thesaurus.expand(own) if 0 < self._df[t] <= limit]
        return sorted(related, key=lambda t: (self._df[t], t))[:_EXPANSIONS]

    def _run(
        self, query_terms: Sequence[str], upstream: str | None, accept: Callable[[str], bool] | None
    ) -> list[tuple[int, float]]:
        """The best ``_CANDIDATES`` (rowid, BM25 score) ``accept`` takes of those matching any
        of ``query_terms``."""
        where, args = self._where(query_terms, upstream)
        if not args:
            return []
        # Ranked in SQLite, and only as far as needed: every ranked row costs a BM25 there.
        ranked = f"SELECT rowid, -rank FROM tools WHERE {where} ORDER BY rank LIMIT ?"
        rows = self._db.execute(ranked, (*args, _CANDIDATES)).fetchall()
        top = [(r, s) for r, s in rows if self._takes(accept, r)]
        if len(rows) == _CANDIDATES and len(top) < _CANDIDATES:  # the asker may call few: rank all
            top = [(r, s) for r, s in self._db.execute(ranked, (*args, -1)) if self._takes(accept, r)]
        return top[:_CANDIDATES]

    def _matched(
        self,
        own: Sequence[str],
        upstream: str | None,
        accept: Callable[[str], bool] | None,
        related: Sequence[int],
    ) -> int:
        """How many tools ``accept`` takes match the query's own terms, or are among the
        ``related`` rows its expansion ranked. Counted in SQLite unless a policy filters: a
        common word matches thousands of rows, not worth reading one by one."""
        where, args = self._where(own, upstream)
        if not args:
            return len(related)
        if accept is not None:
            rows = self._db.execute(f"SELECT rowid FROM tools WHERE {where}", args)
            return len({r for (r,) in rows if accept(self._rows[r].key)} | set(related))
        (count,) = self._db.execute(f"SELECT count(*) FROM tools WHERE {where}", args).fetchone()
        # Plus the expansion's rows the own terms do not match (a row matches a term it holds).
        held = frozenset(own)
        return int(count) + sum(1 for r in related if self._terms[r].isdisjoint(held))

    def _where(self, query_terms: Sequence[str], upstream: str | None) -> tuple[str, tuple[str, ...]]:
        """The condition matching any of ``query_terms`` some tool holds, and its arguments
        (none when no tool holds any)."""
        present = [t for t in query_terms if self._df[t]]
        if not present:
            return "", ()
        expression = " OR ".join(f'"{t}"' for t in present)
        if upstream is None:
            return "tools MATCH ?", (expression,)
        return "tools MATCH ? AND upstream = ?", (expression, upstream)

    def _takes(self, accept: Callable[[str], bool] | None, rowid: int) -> bool:
        return accept is None or accept(self._rows[rowid].key)

    def _bound(self, query_terms: Sequence[str]) -> float:
        """The most the query's own terms can score: each term's IDF times (k1 + 1). A term
        no tool holds counts at its full IDF: a request that is half unknown is a weak match."""
        total = len(self._rows)
        return sum(_idf(total, self._df[t]) * (_K1 + 1) for t in query_terms) or 1.0


@lru_cache(maxsize=16_384)
def _analysed(text: str) -> str:
    """A field's stems, space-separated. Cached: catalogs repeat parameter descriptions
    ("The project ID"), and every tool of an upstream carries its instructions."""
    return " ".join(terms(text))


def _idf(total: int, df: int) -> float:
    """FTS5's BM25 IDF (a term in over half the rows is worth almost nothing)."""
    return max(1e-6, math.log((total - df + 0.5) / (df + 0.5)))
