"""The status page's catalog: each tool's row, made once per definition, and the views of
them the page shows, each at most ``SHOWN`` rows: the first of the catalog, or the first a
search matches. Every tool's row went into every load of the page, so that the search box
could filter them in the browser: 10,000 tools were an 18 MB page, written whole to each
client that loaded it (a bystander's call waited behind it). Now the gateway answers the
search box, and the page's size is that of its ``SHOWN`` rows, whatever the catalog's."""

from __future__ import annotations

import json
import logging
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape as escape_html

import anyio.lowlevel
import mcp_types as types

from agent_gateway.naming import Origin
from agent_gateway.ui.text import cut, escape, first_line

logger = logging.getLogger(__name__)

SHOWN = 100
"""Tools a view of the catalog lists; the others are found with the search box."""
SEARCHED = 1000
"""Characters of a tool's description a search matches (a megabyte description was matched,
and held in the page, whole)."""
SCHEMA_SHOWN = 16 << 10
"""Characters of a tool's input schema (as indented JSON) the page shows; the rest counted."""
LOOKED_AT = 64
"""Bytes of its client's page budget a search costs for each tool it looks through: its cost
to the event loop is the matching, not its answer's bytes (one matching nothing among 10,000
tools is a scan of a megabyte and a few hundred bytes)."""
QUERY = 256
"""Characters of a search the gateway reads (the box's words; the rest are not matched)."""
WORDS = 8
"""Words of a search matched."""
SAMPLE = 1 << 18
"""Characters of the catalog's text a search's words are counted in, to scan for the rarest."""
CHUNK = 1 << 20
"""Characters a search scans in one step of the event loop (~0.5 ms)."""
STEP_COST = CHUNK // 256
"""A row checked, as characters scanned: 256 rows a step (~3.5 us each, in Python)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One tool's row, with the definition and upstream it shows and what a search matches."""

    item: object
    upstream: str
    searched: str
    """Its name, upstream and the start of its description, in lower case."""
    html: str


def row(name: str, upstream: str, description: str | None, item: object) -> Row:
    """A tool's row; its schema is fetched when the row's schema is opened (``schema_text``):
    shown in each of 100 rows, 16 KiB schemas made a page of 1.7 MB."""
    text = description or ""
    html = (
        f'<tr class="tool"><td><code>{escape(name)}</code></td><td>{escape(upstream)}</td>'
        f'<td>{escape(first_line(text))}<details data-tool="{escape(name)}"><summary>input schema</summary>'
        "<pre></pre></details></td></tr>"
    )
    return Row(item, upstream, f"{name} {upstream} {text[:SEARCHED]}".lower(), html)


def schema_text(schema: object) -> str:
    """A tool's input schema as the page shows it: indented JSON, its first ``SCHEMA_SHOWN``
    characters (plain text: the page sets it as a text, never as markup)."""
    return cut(json.dumps(schema, indent=2, ensure_ascii=False), SCHEMA_SHOWN)


class Rows:
    """Every tool's row as last made: a change of one upstream makes only its own rows again
    (one changing its list every second had 9,000 others' made at each rendering)."""

    def __init__(self) -> None:
        self._made: dict[str, Row] = {}

    def update(self, tools: Mapping[str, Origin[types.Tool]]) -> tuple[list[Row], int]:
        """The rows of ``tools``, in their order; with how many were made anew."""
        kept, fresh = self._made, 0
        self._made = {}
        for name, origin in tools.items():
            item, upstream = origin.item, origin.upstream
            last = kept.get(name)
            if last is None or last.item is not item or last.upstream != upstream:
                last = row(name, upstream, item.description, item)
                fresh += 1
            self._made[name] = last
        return list(self._made.values()), fresh


@dataclass(frozen=True)
class Shelf:
    """The catalog's rows at one version, and what a search matches of them joined in one
    text, so that a search finds the rows holding its rarest word (as far as a sample tells) by
    scanning that text (a match never spans two rows: a word holds no whitespace), and checks
    its other words in those rows only, until it has found a view's worth. A row at a time, every word in every
    row, a search of 10,000 tools held the event loop ~10 ms (``bench/README.md``)."""

    rows: list[Row]
    text: str = field(init=False)
    starts: list[int] = field(init=False)
    """Where each row's text begins in ``text``."""

    def __post_init__(self) -> None:
        starts, at = [], 0
        for row in self.rows:
            starts.append(at)
            at += len(row.searched) + 1
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "text", "\n".join(row.searched for row in self.rows))

    async def holding(self, words: list[str], wanted: int) -> tuple[list[Row], bool]:
        """The first ``wanted`` rows holding every one of ``words``, in order; and whether more
        do. In steps of ``CHUNK`` characters scanned at most (a row checked counts ``STEP_COST``): in one,
        10,000 tools each holding 7 of 8 words (an upstream's to choose) held the event loop
        35-50 ms a search, and 8 words found only in the last of 10 MB of text ~40 ms."""
        step = _Steps()
        for word in words:  # a word no row holds: one scan, none found
            if await self._find(word, 0, step) == -1:
                return [], False
        # The rarest in the text's first SAMPLE characters: counting in all of it is a scan a word.
        rarest = min(range(len(words)), key=lambda k: self.text.count(words[k], 0, SAMPLE))
        await step.checked(min(SAMPLE, len(self.text)) * len(words))
        rarest_word, rest = words[rarest], words[:rarest] + words[rarest + 1 :]
        found: list[Row] = []
        at = await self._find(rarest_word, 0, step)
        try:
            while at != -1:
                index = bisect_right(self.starts, at) - 1
                row = self.rows[index]
                if all(word in row.searched for word in rest):
                    if len(found) == wanted:
                        return found, True
                    found.append(row)
                await step.checked(STEP_COST)
                after = index + 1
                at = (
                    await self._find(rarest_word, self.starts[after], step)
                    if after < len(self.starts)
                    else -1
                )
            return found, False
        finally:
            logger.debug("status page search of %d words took %d steps", len(words), step.taken)

    async def _find(self, word: str, start: int, step: _Steps) -> int:
        """Where ``word`` is first in the text from ``start``; -1: nowhere. A chunk at a time."""
        text, end = self.text, len(self.text)
        while start < end:
            stop = min(end, start + CHUNK)
            if (at := text.find(word, start, stop + len(word) - 1)) != -1:  # one starting before stop
                await step.checked(at - start)
                return at
            await step.checked(stop - start)
            start = stop
        return -1


class _Steps:
    """A search's work since the event loop last had its turn, in characters scanned."""

    __slots__ = ("done", "taken")

    def __init__(self) -> None:
        self.done, self.taken = 0, 1

    async def checked(self, characters: int) -> None:
        self.done += characters
        if self.done >= CHUNK:
            self.done, self.taken = 0, self.taken + 1
            await anyio.lowlevel.checkpoint()


def words_of(query: str | None) -> list[str]:
    """The words of a search, as the rows are matched: lower case, the first ``WORDS`` of its
    first ``QUERY`` characters, each once (8 times a word found only in the last row were 8
    scans of the whole text)."""
    return list(dict.fromkeys((query or "")[:QUERY].lower().split()))[:WORDS]  # a word twice: once


def view(version: int, rows: list[Row]) -> str:
    """The catalog section at ``version`` without a search: its first ``SHOWN`` rows."""
    told = f"{min(len(rows), SHOWN)} of {len(rows)} tools{'; search to find the others' if len(rows) > SHOWN else ''}"
    return _section(version, "", told, rows[:SHOWN])


async def found(version: int, shelf: Shelf, query: str | None) -> tuple[str, int]:
    """The catalog section at ``version`` for ``query`` (words a row must all hold; none: every
    row): its first ``SHOWN`` rows, and how many rows it looked through."""
    rows, words = shelf.rows, words_of(query)
    if not words:
        return view(version, rows), 0
    shown, more = await shelf.holding(words, SHOWN)
    said = escape(" ".join(words))
    told = f"{len(shown)} matching <b>{said}</b>{', and more: refine the search' if more else ''}; "
    told += f"{len(rows)} tools in the catalog"
    return _section(version, " ".join(words), told, shown), len(rows)


def _section(version: int, words: str, told: str, shown: list[Row]) -> str:
    # data-query: the words as read, which the refresh sends again (shown with their escapes,
    # U+202E as "\\u202e", they would be searched for as they are).
    head = "<thead><tr><th>Tool</th><th>Upstream</th><th>Description</th></tr></thead>"
    return (
        f'<section id="catalog" data-live data-version="{version}" data-query="{escape_html(words)}">'
        f'<p class="muted" id="shown">{told}</p><table>{head}<tbody>{"".join(r.html for r in shown)}</tbody>'
        "</table></section>"
    )
