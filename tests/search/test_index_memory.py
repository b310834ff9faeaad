"""What the search index keeps between listings: an upstream that lists a long description
that changes each time (a log, a timestamped report) costs the index its latest only."""

from __future__ import annotations

import gc
import random
import tracemalloc

from agent_gateway.search.index import Document, ToolIndex

LISTINGS = 6
WORDS = 150_000
"""Words of each new description: ~1 MB of text."""


def test_long_descriptions_that_change_at_each_listing_are_not_kept_by_the_index() -> None:
    vocabulary = [f"w{i}" for i in range(20_000)]
    index = ToolIndex()
    tracemalloc.start()
    try:
        for _ in range(LISTINGS):
            text = " ".join(random.choices(vocabulary, k=WORDS))
            index.replace(
                "report", [Document(key="report__report", upstream="report", name="report", description=text)]
            )
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] / 2**20
    finally:
        tracemalloc.stop()
    assert [h.key for h in index.search("w7 report", limit=5).hits] == ["report__report"]
    # Before: each text and its stems stayed in a cache of 16,384 texts, ~2.5 MB a listing here
    # (28 MB after these, 13 with it; a cache's worth of them, gigabytes).
    assert held < 20, f"{held:.0f} MB held after {LISTINGS} listings of a new 1 MB description"
