"""The gateway's CPU per ``tools/call``, alone: a quicker, steadier A/B than ``overhead.py``.

The upstream and the gateway each run in a child process, as ``overhead.py`` runs them by
default (the gateway as ``agent-gateway serve`` runs it); nothing else is measured, so two
versions of the code can be alternated several times in the minutes one ``overhead.py`` run
takes. ``--callers`` clients (one session each) make ``--calls`` calls in all; the gateway
child's CPU (user + system, from ``/proc``) over them, divided by the calls, is the figure;
then one client's sequential p50 over ``--sequential`` calls.

Run from the repository root; other code (a worktree) is measured with its ``src`` first::

    .venv/bin/python bench/cpu_per_call.py --mode legacy|auto
    PYTHONPATH=/tmp/wt-X/src .venv/bin/python bench/cpu_per_call.py --mode auto
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import anyio

import agent_gateway

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `bench` importable
from bench import overhead


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def revision() -> str:
    """The commit of the ``agent_gateway`` measured (the one on ``PYTHONPATH``, if set)."""
    where = Path(agent_gateway.__file__).parent
    command = ["git", "-C", str(where), "rev-parse", "--short", "HEAD"]
    return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip() or "?"


async def measure(mode: str, calls: int, callers: int, sequential: int) -> str:
    async with overhead.in_child("upstream", "") as upstream:
        others = {p.pid for p in multiprocessing.active_children()}
        async with overhead.in_child("agent-gateway", upstream) as url:
            pid = next(p.pid for p in multiprocessing.active_children() if p.pid and p.pid not in others)
            scenario = overhead.Scenario("agent-gateway", "up__echo")
            await overhead.concurrent(url, scenario, callers, 20, mode)  # warm
            cpu, started = cpu_seconds(pid), time.perf_counter()
            loaded = await overhead.concurrent(url, scenario, callers, calls // callers, mode)
            cpu, seconds = cpu_seconds(pid) - cpu, time.perf_counter() - started
            alone = await overhead.sequential(url, scenario, sequential, mode)
    return (
        f"| {revision()} | {mode} | {loaded.calls} | {cpu / loaded.calls * 1e3:.3f} | "
        f"{loaded.calls / seconds:.0f} | {alone.percentile(50):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mode", default="legacy", help="legacy (handshake era, default) or auto (modern)")
    parser.add_argument("--calls", type=int, default=3000, help="calls in all, under load (default 3000)")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers (default 16)")
    parser.add_argument(
        "--sequential", type=int, default=200, help="sequential calls for the p50 (default 200)"
    )
    args = parser.parse_args()
    overhead.quiet_logging()
    row = anyio.run(measure, args.mode, args.calls, args.callers, args.sequential)
    print("| code | era | calls | gateway CPU ms per call | calls/s | sequential p50 ms |")
    print("|---|---|---:|---:|---:|---:|")
    print(row)
    print(f"\ncommand: `.venv/bin/python bench/cpu_per_call.py {shlex.join(sys.argv[1:])}`")


if __name__ == "__main__":
    main()
