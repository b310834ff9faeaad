"""A client's policy applied to a search's every matching row: this checkout against another
(``--against``, the ``src`` of the code before), alternating, each run a child process.

``search_tools`` keeps only the rows the client's policy allows: each row's public name is
matched against the policy's globs (``access.Principal.allows``). The catalog here is the
2,815 tools of ``bench/data/tool_search`` four times over (11,260 names, each copy under its
own upstream names), the policy 30 globs naming 30 of its upstreams; a pass asks about every
name, as a search of common words matching every row does.

    .venv/bin/python bench/policy_filter.py --against /tmp/wt-before/src [--runs 2]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its neighbours importable
from search_latency import alternated, printed

ROOT = Path(__file__).resolve().parent.parent
PASSES = 20


def measure() -> dict[str, float]:
    """The first pass and the median of the next ``PASSES`` in ms."""
    from agent_gateway.access import Principal
    from agent_gateway.config import ClientPolicy

    servers = json.loads((ROOT / "bench/data/tool_search/tools.json").read_text())["servers"]
    names = [
        f"{server['name']}{copy}__{tool['name']}"
        for copy in range(4)
        for server in servers
        for tool in server["tools"]
    ]
    upstreams = sorted({name.split("__")[0] for name in names})
    globs = tuple(f"{u}__*" for u in upstreams[:30])
    client = Principal(subject="restricted", policy=ClientPolicy(tools=globs), policy_name="restricted")
    times: list[float] = []
    allowed = 0
    for _ in range(PASSES + 1):
        started = time.perf_counter()
        allowed = sum(client.allows("tool", name) for name in names)
        times.append((time.perf_counter() - started) * 1e3)
    assert allowed, "the policy allows some names"
    later = sorted(times[1:])
    return {"first": times[0], "p50": later[len(later) // 2], "names": len(names)}


def main() -> None:
    rows = alternated("policy_filter", (__doc__ or "").splitlines()[0])
    names = int(rows["before"][0]["names"])
    printed(
        rows,
        {f"first pass over {names:,} names, ms": ("first", ".1f"), "later passes, p50 ms": ("p50", ".1f")},
    )


if __name__ == "__main__":
    main()
