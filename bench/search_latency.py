"""The gateway's tool search in process, per request: this checkout against another (``--against``
the ``src`` of the code before), alternating, on the 2,815 tools and 355 requests of
``bench/data/tool_search``. Each run is a child process, so each imports its own code.

    .venv/bin/python bench/search_latency.py --against /tmp/wt-before/src [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(repeats: int) -> dict[str, float]:
    """p50 and p99 in ms of every request, ``repeats`` times each, after one warm pass."""
    sys.path.insert(0, str(ROOT))
    from bench.tool_search import gateway_ranker, load

    async def run() -> list[float]:
        servers, queries = load()
        times: list[float] = []
        async with gateway_ranker(servers) as rank:
            for query in queries:
                await rank(query.text)
            for _ in range(repeats):
                for query in queries:
                    started = time.perf_counter()
                    await rank(query.text)
                    times.append(time.perf_counter() - started)
        return sorted(times)

    times = asyncio.run(run())
    return {"p50": times[len(times) // 2] * 1e3, "p99": times[int(len(times) * 0.99)] * 1e3}


def child(src: Path, repeats: int) -> dict[str, float]:
    return measured_in(src, "search_latency", f"measure({repeats})")


def measured_in(src: Path, module: str, call: str) -> dict[str, float]:
    """``module.call`` (a module of ``bench/``) run in a child process importing ``src``: what
    it returns, a JSON object."""
    code = f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import {module} as m; print(json.dumps(m.{call}))"
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(src)}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", type=Path, required=True, help="the src directory of the code before")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"before": [], "this checkout": []}
    for _ in range(options.runs):
        rows["before"].append(child(options.against, options.repeats))
        rows["this checkout"].append(child(ROOT / "src", options.repeats))
    printed(rows, {"p50 ms": ("p50", ".2f"), "p99 ms": ("p99", ".2f")})


def alternated(module: str, description: str) -> dict[str, list[dict[str, float]]]:
    """``module.measure()`` run in the code before (``--against``, its ``src``) and in this
    checkout, alternating, ``--runs`` times each: every run's figures by code."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--against", type=Path, required=True, help="the src directory of the code before")
    parser.add_argument("--runs", type=int, default=2)
    options = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"before": [], "this checkout": []}
    for _ in range(options.runs):
        rows["before"].append(measured_in(options.against, module, "measure()"))
        rows["this checkout"].append(measured_in(ROOT / "src", module, "measure()"))
    return rows


def printed(rows: dict[str, list[dict[str, float]]], columns: dict[str, tuple[str, str]]) -> None:
    """A table of one line per code, each column (its heading: the figure's key, its format)
    every run's figure; then the command that made it."""
    print("| code | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns))
    for name, runs in rows.items():
        cells = [", ".join(format(run[key], shape) for run in runs) for key, shape in columns.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\ncommand: {shlex.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
