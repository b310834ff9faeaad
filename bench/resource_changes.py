"""What one upstream's change costs the catalog when the upstreams list many resources: the
time of ``catalog.merge`` (the event loop's, as a change is merged on it) for one upstream's
new listing, with ``--upstreams`` upstreams of ``--resources`` resources each (one in ten of
each upstream's URIs also listed by the next upstream: qualified as ``{upstream}+{uri}``).

Three changes: the upstream's tools only (its resources the same), one resource more, and
one resource more that another upstream lists too. ``--against /tmp/wt-X/src`` measures that
code and this one, each in its own process, side by side (``--pairs`` times).

    .venv/bin/python bench/resource_changes.py --against /tmp/wt-X/src
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import mcp_types as types

from agent_gateway.catalog import merge
from agent_gateway.catalog_parts import Listing, build_part
from agent_gateway.config_files import parse_config
from agent_gateway.runtime import prepare_heap, settle_heap

_ROW = re.compile(r"^RESULT ([\d.]+) ([\d.]+) ([\d.]+)$", re.MULTILINE)
CHANGES = ("tools only", "a resource more", "a resource more, listed by another too")


def _listing(upstream: int, resources: int, extra: str | None = None, tool: str = "t") -> Listing:
    shared = [f"file:///shared/{upstream + 1}/{n}" for n in range(0, resources, 10)]
    own = [f"file:///u{upstream}/{n}" for n in range(resources - len(shared))]
    uris = [*shared, *own, *([extra] if extra else [])]
    if upstream > 0:  # the URIs the previous upstream shares with this one
        uris[: len(shared)] = [f"file:///shared/{upstream}/{n}" for n in range(0, resources, 10)]
    items = tuple(types.Resource(uri=uri, name=uri.rsplit("/", 1)[1]) for uri in uris)
    tools = (types.Tool(name=tool, input_schema={"type": "object"}),)
    return Listing(tools=tools, resources=items)


def measure(upstreams: int, resources: int, repeats: int) -> list[float]:
    """The median ms of ``merge`` for each of ``CHANGES``."""
    names = [f"u{n}" for n in range(upstreams)]
    config = parse_config(
        {"upstreams": {n: {"url": f"http://127.0.0.1:9/{n}"} for n in names}}, {}, source="bench"
    )
    prepare_heap()  # the heap as `agent-gateway serve` keeps it: start-up's objects frozen
    parts = [build_part(config, n, _listing(i, resources)) for i, n in enumerate(names)]
    snapshot = merge(parts, 1)
    settle_heap()
    changed = {
        CHANGES[0]: lambda k: _listing(1, resources, tool=f"t{k}"),
        CHANGES[1]: lambda k: _listing(1, resources, extra=f"file:///u1/new{k}"),
        CHANGES[2]: lambda k: _listing(1, resources, extra="file:///shared/1/0"),
    }
    figures: list[float] = []
    for change in CHANGES:
        times: list[float] = []
        for k in range(repeats):
            part = build_part(config, "u1", changed[change](k))  # built as the upstream's listing arrives
            snapshot = _timed(
                lambda p=part, s=snapshot: merge([*parts[:1], p, *parts[2:]], s.version + 1, s), times
            )
        figures.append(statistics.median(times))
    return figures


def _timed(run: Callable[[], object], times: list[float]) -> object:
    started = time.perf_counter()
    result = run()
    times.append((time.perf_counter() - started) * 1e3)
    return result


def against(base: str, args: argparse.Namespace) -> None:
    own = [sys.executable, __file__, "--upstreams", str(args.upstreams), "--resources", str(args.resources)]
    print(f"`merge` ms, {args.upstreams} upstreams x {args.resources:,} resources, one upstream's change")
    print()
    print("| pair | change | before | after | after / before |")
    print("|---:|---|---:|---:|---:|")
    for pair in range(1, args.pairs + 1):
        runs = [
            subprocess.run(own, capture_output=True, text=True, env=os.environ | extra, check=True).stdout
            for extra in ({"PYTHONPATH": base}, {})
        ]
        rows = [_ROW.search(printed) for printed in runs]
        if rows[0] is None or rows[1] is None:
            raise SystemExit(f"pair {pair}: a run printed no result: {runs}")
        for i, change in enumerate(CHANGES):
            before, after = float(rows[0].group(i + 1)), float(rows[1].group(i + 1))
            print(f"| {pair} | {change} | {before:.1f} | {after:.1f} | **{after / before:.3f}** |")
    print(f"\ncommand: `.venv/bin/python bench/resource_changes.py {shlex.join(sys.argv[1:])}`")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--upstreams", type=int, default=10)
    parser.add_argument(
        "--resources", type=int, default=10_000, help="resources an upstream (default 10,000)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="changes timed, each kind (default 7)")
    parser.add_argument("--against", help="another src directory (the baseline), measured in turn")
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    if args.against:
        against(args.against, args)
        return
    figures = measure(args.upstreams, args.resources, args.repeats)
    print("RESULT " + " ".join(f"{f:.2f}" for f in figures))


if __name__ == "__main__":
    main()
