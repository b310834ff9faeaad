"""The longest step of the event loop a status page search takes (``ui/catalog.py``), among
10,000 tools each holding 7 of the search's 8 words (an upstream's descriptions are its own),
and 8 times a word found only in the last row; against a baseline, a search of a plain catalog
(``Bulk tool number N.``) finding its 100 rows. Run with PYTHONPATH at the code to measure::

    PYTHONPATH=src .venv/bin/python bench/status_search_steps.py
"""

from __future__ import annotations

import asyncio
import random
import statistics
import string
import time

from agent_gateway.ui import catalog

TOOLS = 10_000
WORDS = [f"w{k}q" for k in range(8)]


def crafted(n: int, padding: int) -> str:
    held = [w for k, w in enumerate(WORDS) if k != n % 8]
    return (
        "".join(random.choice(string.ascii_lowercase + "  ") for _ in range(padding)) + " " + " ".join(held)
    )


async def searched(shelf: catalog.Shelf, query: str) -> object:
    if hasattr(catalog, "found"):  # in steps
        return await catalog.found(1, shelf, query)
    return catalog.view(1, shelf, query)  # type: ignore[call-arg]  # the code before: one step


async def longest_step(shelf: catalog.Shelf, query: str) -> float:
    """The longest the loop went without a turn for another task during a search, in ms (the
    median of 5 searches)."""
    longest: list[float] = []
    for _ in range(5):
        gaps: list[float] = []
        done = asyncio.Event()
        ticker = asyncio.create_task(_ticking(gaps, done))
        await asyncio.sleep(0)
        await searched(shelf, query)
        done.set()
        await ticker
        longest.append(max(gaps) * 1000)
    return statistics.median(longest)


async def _ticking(gaps: list[float], done: asyncio.Event) -> None:
    last = time.perf_counter()
    while not done.is_set():
        await asyncio.sleep(0)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def main() -> None:
    random.seed(1)
    plain = catalog.Shelf(
        [catalog.row(f"tool_{n}", "bulk", f"Bulk tool number {n}.", None) for n in range(TOOLS)]
    )
    base = await longest_step(plain, "bulk number")
    print(f"baseline (a plain catalog, 'bulk number'): {base:.1f} ms")
    for padding in (20, 960):
        shelf = catalog.Shelf([catalog.row(f"t{n}", "up", crafted(n, padding), None) for n in range(TOOLS)])
        await longest_step(shelf, "warm up")
        for name, query in (
            ("8 words, 7 in each row", " ".join(WORDS)),
            ("a word 8 times", " ".join(["t9999"] * 7 + ["zzq"])),
        ):
            ms = await longest_step(shelf, query)
            print(f"descriptions of {padding} characters, {name}: {ms:.1f} ms ({ms / base:.1f}x)")


if __name__ == "__main__":
    asyncio.run(main())
