"""One upstream stuffing its tools' descriptions with the words users ask with: how much of
tool search it takes, with and without a ``search_weight`` on it.

The catalog and requests are ``tool_search.py``'s (2,900 real tools, 336 requests); one more
upstream, ``stuffed``, adds five tools of no use whose descriptions hold every word of the
requests (the worst case: the attacker knows them):

- ``every-word``: each of the five holds all 1,000 words (813 terms once analysed);
- ``a-fifth-each``: each holds a fifth of them (about 185 terms: a real description's size);
- ``a-fifth-each-ten-times``: the same, each word ten times over.

Per row: recall@1/5/10 over the requests some real tool serves, and in how many of them a
stuffed tool is among the first five. Run it against another checkout's ``src`` (a worktree of
the code before) with ``PYTHONPATH=/tmp/before/src`` to compare; ``--weights`` are skipped
there when that code has no ``search_weight``.

    .venv/bin/python bench/search_poisoning.py [--weights 1 0.5 0]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tool_search as ts

from agent_gateway.config import UpstreamConfig

STUFFED = "stuffed"


def stuffed(queries: list[ts.Query], mode: str) -> dict[str, Any]:
    words = sorted({w for q in queries for w in re.findall(r"[a-z]+", q.text.lower())})
    if mode == "every-word":
        descriptions = [" ".join(words)] * 5
    else:
        repeats = 10 if mode.endswith("ten-times") else 1
        descriptions = [" ".join(w for w in words[i::5] for _ in range(repeats)) for i in range(5)]
    tools = [
        {"name": f"helper_{i}", "description": d, "inputSchema": {"type": "object"}}
        for i, d in enumerate(descriptions)
    ]
    return {"name": STUFFED, "tools": tools}


async def measure(
    servers: list[dict[str, Any]], queries: list[ts.Query], weight: float | None
) -> tuple[ts.Tally, int]:
    upstreams = {STUFFED: {"search_weight": weight}} if weight is not None else None
    async with ts.gateway_ranker(servers, upstreams=upstreams) as rank:
        tallies, _, _ = await ts.evaluate(rank, queries)
        taken = 0
        for query in queries:
            if query.relevant:
                ranked = await rank(query.text)
                taken += any(key.startswith(f"{STUFFED}/") for key, _ in ranked[:5])
    return tallies["all"], taken


async def run(weights: list[float]) -> None:
    servers, queries = ts.load()
    weighable = "search_weight" in UpstreamConfig.model_fields
    print("| upstreams | search_weight of `stuffed` | recall@1 | recall@5 | recall@10 | stuffed in top 5 |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in ("none", "every-word", "a-fifth-each", "a-fifth-each-ten-times"):
        catalog = servers if mode == "none" else [*servers, stuffed(queries, mode)]
        for weight in weights if mode != "none" and weighable else [None]:
            tally, taken = await measure(catalog, queries, weight)
            recall = " | ".join(f"{tally.hits[k] / tally.n:.3f}" for k in ts.KS)
            shown = "-" if weight is None else f"{weight:g}"
            print(
                f"| real tools{'' if mode == 'none' else ' + ' + mode} | {shown} | {recall} | {taken}/{tally.n} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--weights", type=float, nargs="+", default=[1.0, 0.5, 0.0])
    options = parser.parse_args()
    asyncio.run(run(options.weights))
    print(f"\ncommand: {shlex.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
