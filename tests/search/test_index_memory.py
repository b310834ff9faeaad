"""What the search index keeps between listings: an upstream that lists a long description
that changes each time (a log, a timestamped report) costs the index its latest only."""

from __future__ import annotations

import gc
import random
import tracemalloc

from agent_gateway.search.index import Document, ToolIndex

LISTINGS = 6
WORDS = 60_000
"""Words of each new description: ~400 KB of text (tracing every allocation of its analysis
is what takes this test's time; a text four times longer shows the same)."""


def _held_mb() -> float:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / 2**20


def test_long_descriptions_that_change_at_each_listing_are_not_kept_by_the_index() -> None:
    vocabulary = [f"w{i}" for i in range(20_000)]
    index = ToolIndex()
    tracemalloc.start()
    try:
        held: list[float] = []
        for _ in range(LISTINGS):
            text = " ".join(random.choices(vocabulary, k=WORDS))
            index.replace(
                "report", [Document(key="report__report", upstream="report", name="report", description=text)]
            )
            held.append(_held_mb())
    finally:
        tracemalloc.stop()
    assert [h.key for h in index.search("w7 report", limit=5).hits] == ["report__report"]
    # Measured from the first listing on, past what the first one fills once (the word
    # caches, ~12 MB). Before: each text and its stems stayed in a cache of 16,384 texts,
    # ~1 MB a listing here (5.5 MB over these; 0.3-0.5 with it; a cache's worth, gigabytes).
    grown = held[-1] - held[0]
    assert grown < 2, f"{grown:.1f} MB more held after {LISTINGS - 1} more listings of a new description"
