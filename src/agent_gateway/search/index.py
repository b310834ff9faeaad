"""The lexical tool index: BM25 over each tool's fields, in SQLite's FTS5, updated per upstream.

SQLite's FTS5 (in Python's standard library) holds the index and scores it with its own BM25,
with a weight per field: the tool's name counts most, then its title, its upstream's name, its
description and its parameters. An upstream's instructions are its own, not each tool's: a
tool the query matches gains what of the query they hold (``INSTRUCTIONS_WEIGHT``), so they
help tell one upstream's tools from another's, but neither lengthen each tool's text for BM25
(a long text scores less) nor count as what each tool covers in the rerank (instructions
naming the upstream's tools made every one of them cover the request). Text is analysed here
(``text.terms``: identifiers split, stop words dropped, Snowball stems) and stored as stems, so
queries and documents are analysed alike. One upstream's change replaces only its rows.

A query's score is the sum of its terms' (FTS5's BM25 adds up per term): each term's scores
come from FTS5 once and are kept until the index changes, and a search adds them up: its own
terms at full weight, and for the words the thesaurus found phrases for, the best of those
phrases, worth at most ``SYNONYM_WEIGHT`` of the words they stand in for (``_scored``).

The best candidates by BM25 are then reranked: by how much of the request each covers, how much
of its name the request explains, and whether its action can serve the one the request asks
(``intent.py``). The score returned is the reranked sum over the most the query's own terms
could score (every term matched, BM25 saturated), cut to [0, 1]: how well the tool matches the
request, its words and its action, so a caller can tell a weak match from a strong one.
"""

from __future__ import annotations

import heapq
import math
import sqlite3
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from agent_gateway.search.intent import Action, conflicts, performed, requested
from agent_gateway.search.text import terms
from agent_gateway.search.thesaurus import Thesaurus

FIELDS = ("name", "title", "description", "params", "server")
WEIGHTS = (6.0, 3.0, 2.0, 1.0, 3.0)
"""BM25 weights per field (FTS5 multiplies each field's term frequency by its weight)."""
INSTRUCTIONS_WEIGHT = 0.1
"""What each query term an upstream's instructions hold adds to its matching tools' scores,
times the term's IDF (a term a tool's own field holds once scores about 2.5 times that)."""
_K1 = 1.2  # FTS5's own BM25 parameters
_CACHED = 1_000_000
"""Term postings kept between searches, in rows (16 bytes each: at most ~16 MB)."""
_TERM_ROWS = 24
"""What a kept term costs besides its rows (its entry and arrays, ~380 bytes), in rows."""
MOST_CHARS = 4_096
MOST_TERMS = 64
"""What of a query counts: its first ``MOST_CHARS`` characters, and of those its first
``MOST_TERMS`` distinct terms. A longer one (a pasted log) costs no more to search."""
_COMMON = 0.1
"""An expansion term found in more than this share of all tools says too little to run."""
SYNONYM_WEIGHT = 0.5
"""How much a word the query did not use counts, against one it did."""
COORD_BASE = 1.0
"""Rerank: a tool covering none of the request keeps half its BM25 score, all of it, all."""
NAME_WEIGHT = 0.2
"""Rerank: what a tool whose name the request explains word for word gains (scores are 0..1)."""
OTHER_ACTION = 0.7
"""Rerank: what a tool whose action cannot serve the request's (``intent.conflicts``) keeps of
its score."""
_RERANKED = 60
"""The candidates, best by BM25, that the coverage rerank reorders."""
_FEW = 50
"""Below this many rows a term is never too common to expand with (a small index is cheap)."""
_EXPANSIONS = 8
"""The rarest related phrases a query is expanded with (each term costs a pass over its rows)."""
BROAD = 400
"""Distinct terms of a tool's own fields (name, title, description, parameters) past which
its matches count for less, in proportion: the most any of the benchmark's 2,900 real tools
holds is 345 (a description alone: 200). A description stuffed with every word users ask
with (813 terms) matched every request fully and took the top 5 of half of them
(``bench/README.md``, "A stuffed upstream")."""


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
    weight: float = 1.0
    """Its upstream's ``search_weight``: its matches' scores are multiplied by it (0: none)."""

    def fields(self) -> tuple[str, ...]:
        return (self.name, self.title, self.description, self.params, self.server)


@dataclass(frozen=True, slots=True)
class _Row:
    key: str
    upstream: str


@dataclass(frozen=True, slots=True)
class Hit:
    key: str
    upstream: str
    score: float
    """How well this tool matches the query, its words and its action, 0 (nothing) to 1."""


@dataclass(frozen=True, slots=True)
class Results:
    hits: list[Hit]
    total: int
    """Every tool the filters keep that matched the query at all, through its own terms or
    its expansion (before ``limit``)."""


class ToolIndex:
    """BM25 over tool documents; rows are replaced one upstream at a time. Use it from one
    thread at a time (searches update the kept term scores too): at start-up the search
    engine's worker thread, then the event loop's."""

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
        self._instructions: dict[str, frozenset[str]] = {}
        """The terms of each upstream's instructions (those that have any)."""
        self._df: Counter[str] = Counter()
        self._terms: dict[int, frozenset[str]] = {}
        self._names: dict[int, frozenset[str]] = {}
        self._actions: dict[int, Action | None] = {}
        self._scale: dict[int, float] = {}
        """What a row's matches are multiplied by, where it is not 1: its upstream's weight,
        and ``BROAD`` over its breadth when it is broader."""
        self._next = 1
        self._postings_of: dict[str, tuple[array[int], array[float]]] = {}
        self._cached = 0

    def __len__(self) -> int:
        return len(self._rows)

    def replace(self, upstream: str, documents: Iterable[Document]) -> None:
        """Make ``documents`` the whole of ``upstream``'s part of the index."""
        self.remove(upstream)
        rows: list[tuple[object, ...]] = []
        ids: list[int] = []
        long: dict[str, str] = {}
        for document in documents:
            if document.instructions and upstream not in self._instructions:
                self._instructions[upstream] = frozenset(_analysed_once(document.instructions, long).split())
            analysed = [_analysed_once(text, long) for text in document.fields()]
            rowid, self._next = self._next, self._next + 1
            rows.append((rowid, *analysed, upstream))
            ids.append(rowid)
            self._rows[rowid] = _Row(document.key, upstream)
            unique = frozenset(" ".join(analysed).split())
            self._terms[rowid] = unique
            self._names[rowid] = frozenset(analysed[0].split())
            self._actions[rowid] = performed(document.name)
            self._df.update(unique)
            breadth = len(frozenset(" ".join(analysed[:4]).split()))
            if (scale := document.weight * min(1.0, BROAD / (breadth or 1))) != 1.0:
                self._scale[rowid] = scale
        placeholders = ", ".join("?" * (len(FIELDS) + 2))
        self._db.executemany(
            f"INSERT INTO tools(rowid, {', '.join(FIELDS)}, upstream) VALUES ({placeholders})", rows
        )
        self._of_upstream[upstream] = ids
        self._forget_postings()

    def remove(self, upstream: str) -> None:
        """Take ``upstream``'s rows out of the index."""
        ids = self._of_upstream.pop(upstream, [])
        self._instructions.pop(upstream, None)
        if not ids:
            return
        self._db.executemany("DELETE FROM tools WHERE rowid = ?", [(i,) for i in ids])
        self._forget_postings()
        for rowid in ids:
            del self._rows[rowid]
            del self._names[rowid]
            del self._actions[rowid]
            self._scale.pop(rowid, None)
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
        """The ``limit`` best tools for ``query`` (its first words: ``MOST_TERMS``), best
        first; only those ``accept`` takes (by public name) and, given ``upstream``, only that
        upstream's."""
        # The first words only: each distinct term costs a lookup, and the agent's queries lead
        # with the latest request and run on into the conversation.
        in_order = list(dict.fromkeys(terms(query[:MOST_CHARS])))[:MOST_TERMS]
        own = sorted(in_order)
        if not own or not self._rows:
            return Results([], 0)
        related = self._related(in_order)  # in the query's order: the thesaurus matches phrases
        scores = self._scored(own, related, upstream, accept)
        best = self._bound(own)
        weights = {t: _idf(len(self._rows), self._df[t]) for t in own}
        wanted = dict.fromkeys((t for phrase in related for t in phrase), SYNONYM_WEIGHT) | dict.fromkeys(
            own, 1.0
        )
        # Only the best by BM25 are reranked: the rerank reorders them, it does not search.
        leaders = heapq.nsmallest(max(_RERANKED, limit), scores.items(), key=lambda item: (-item[1], item[0]))
        asked = requested(query)
        final = {r: self._reranked(r, s / best, weights, wanted, asked) for r, s in leaders}
        ranked = sorted(final.items(), key=lambda item: (-item[1], item[0]))[:limit]
        hits = [Hit(self._rows[r].key, self._rows[r].upstream, min(1.0, score)) for r, score in ranked]
        return Results(hits, len(scores))

    def _scored(
        self,
        own: Sequence[str],
        related: dict[tuple[str, ...], frozenset[str]],
        upstream: str | None,
        accept: Callable[[str], bool] | None,
    ) -> dict[int, float]:
        """Every row matching a term of the query (or of its expansion) that ``upstream`` and
        ``accept`` keep, with its BM25 score: the sum of each own term's, and for each set of
        own terms the thesaurus found phrases for, the best of those phrases' scores.

        A related phrase stands in for the words that brought it: scaled down to their IDF
        (all of its terms' against all of theirs), it is worth at most ``SYNONYM_WEIGHT`` of
        them, and of several standing in for the same words only the best counts. Summed at
        their own IDF, the rare words of a synonym group outweighed the request's own. A tool
        holding both the word and a phrase for it gains both."""
        scores: dict[int, float] = {}
        for term in own:
            if self._df[term]:
                for rowid, value in zip(*self._postings(term), strict=True):
                    scores[rowid] = scores.get(rowid, 0.0) + value
        by_sources: dict[frozenset[str], list[tuple[str, ...]]] = {}
        for phrase, sources in related.items():
            by_sources.setdefault(sources, []).append(phrase)
        for sources, phrases in by_sources.items():
            worth = sum(self._idf(t) for t in sources)
            best: dict[int, float] = {}
            for phrase in phrases:
                scale = SYNONYM_WEIGHT * min(1.0, worth / sum(self._idf(t) for t in phrase))
                matched: dict[int, float] = {}
                for term in phrase:
                    for rowid, value in zip(*self._postings(term), strict=True):
                        matched[rowid] = matched.get(rowid, 0.0) + scale * value
                for rowid, value in matched.items():
                    if value > best.get(rowid, 0.0):
                        best[rowid] = value
            for rowid, value in best.items():
                scores[rowid] = scores.get(rowid, 0.0) + value
        self._instructed(own, scores)
        # Before the leaders are taken, so that none is held by a row scaled out of them (the
        # keys' intersection walks the smaller side).
        for rowid in self._scale.keys() & scores.keys():
            if (scale := self._scale[rowid]) > 0.0:
                scores[rowid] *= scale
            else:
                del scores[rowid]
        if upstream is None and accept is None:
            return scores
        rows = self._rows
        return {
            r: s
            for r, s in scores.items()
            if (upstream is None or rows[r].upstream == upstream) and (accept is None or accept(rows[r].key))
        }

    def _instructed(self, own: Sequence[str], scores: dict[int, float]) -> None:
        """Add to each matching tool what of ``own`` its upstream's instructions hold."""
        for upstream, held in self._instructions.items():
            if gained := INSTRUCTIONS_WEIGHT * sum(self._idf(t) for t in own if t in held):
                for rowid in self._of_upstream[upstream]:
                    if rowid in scores:
                        scores[rowid] += gained

    def _idf(self, term: str) -> float:
        return _idf(len(self._rows), self._df[term])

    def _postings(self, term: str) -> tuple[array[int], array[float]]:
        """The rows holding ``term`` and the BM25 score FTS5 gives each for ``term`` alone.

        FTS5's BM25 is a sum over a query's terms (each term's IDF times its saturated,
        weighted frequency in the row), so a query's score is the sum of these: SQLite scores
        each term once, and a search adds them up instead of ranking every matching row again.
        Kept until the index changes (the IDF and average length move with every row), at most
        ``_CACHED`` rows' worth, least recently used dropped first."""
        found = self._postings_of.pop(term, None)
        if found is None:
            rows = self._db.execute("SELECT rowid, -rank FROM tools WHERE tools MATCH ?", (f'"{term}"',))
            rowids, values = array("q"), array("d")
            for rowid, value in rows:
                rowids.append(rowid)
                values.append(value)
            found = (rowids, values)
            self._cached += len(rowids) + _TERM_ROWS
            while self._cached > _CACHED and self._postings_of:
                dropped = self._postings_of.pop(next(iter(self._postings_of)))
                self._cached -= len(dropped[0]) + _TERM_ROWS
        self._postings_of[term] = found  # the most recently used last
        return found

    def _forget_postings(self) -> None:
        self._postings_of.clear()
        self._cached = 0

    def _reranked(
        self,
        rowid: int,
        score: float,
        weights: dict[str, float],
        wanted: dict[str, float],
        asked: Action | None,
    ) -> float:
        """``score`` adjusted by how much of the request the tool covers (BM25 alone lets one
        rare word outweigh the rest), how much of the tool's name the request explains, and
        whether the tool's action can serve ``asked``, the request's (``OTHER_ACTION`` if not).

        ``weights``: the IDF of each of the query's own terms; ``wanted``: what a name term
        found in the query (1) or among its related terms (``SYNONYM_WEIGHT``) is worth.
        """
        held = self._terms[rowid]
        coord = sum(w for t, w in weights.items() if t in held) / (sum(weights.values()) or 1.0)
        name = self._names[rowid]
        explained = sum(wanted.get(t, 0.0) for t in name) / (len(name) or 1)
        reranked = score * (COORD_BASE + coord) / (COORD_BASE + 1) + NAME_WEIGHT * explained
        return reranked * OTHER_ACTION if conflicts(asked, self._actions[rowid]) else reranked

    def _related(self, own: list[str]) -> dict[tuple[str, ...], frozenset[str]]:
        """The thesaurus's phrases for ``own``, each with the terms of ``own`` it stands in for:
        of each, the terms some tool holds and not too many do (a term most tools hold tells
        them apart no better than none); at most ``_EXPANSIONS`` phrases, rarest first."""
        limit = max(_COMMON * len(self._rows), _FEW)
        related: dict[tuple[str, ...], frozenset[str]] = {}
        for phrase, sources in self._thesaurus.standing_in(own).items():
            kept = tuple(t for t in phrase if 0 < self._df[t] <= limit)
            if kept:
                related[kept] = related.get(kept, frozenset()) | sources
        rarest = sorted(related, key=lambda p: (min(self._df[t] for t in p), p))[:_EXPANSIONS]
        return {phrase: related[phrase] for phrase in rarest}

    def _bound(self, query_terms: Sequence[str]) -> float:
        """The most the query's own terms can score: each term's IDF times (k1 + 1). A term
        no tool holds counts at its full IDF: a request that is half unknown is a weak match."""
        total = len(self._rows)
        return sum(_idf(total, self._df[t]) * (_K1 + 1) for t in query_terms) or 1.0


_CACHED_TEXT = 1_024
"""Fields up to this long are analysed through a cache every listing shares; a longer one (a
description, an upstream's instructions) only once within its listing. Cached, an upstream
whose long description changed at each listing left each text and its stems behind: ~4.7 MB a
listing of a 1 MB description, up to 16,384 of them."""


def _analysed_once(text: str, long: dict[str, str]) -> str:
    """``text``'s stems; ``long``: the long texts of this listing analysed so far."""
    if len(text) <= _CACHED_TEXT:
        return _analysed(text)
    if (known := long.get(text)) is None:
        known = long[text] = " ".join(terms(text))
    return known


@lru_cache(maxsize=16_384)
def _analysed(text: str) -> str:
    """A field's stems, space-separated. Cached: catalogs repeat parameter descriptions
    ("The project ID")."""
    return " ".join(terms(text))


def _idf(total: int, df: int) -> float:
    """FTS5's BM25 IDF (a term in over half the rows is worth almost nothing)."""
    return max(1e-6, math.log((total - df + 0.5) / (df + 0.5)))
