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

``--perf FILE`` records the gateway's loaded phase with Linux ``perf`` and prints where its
CPU went by shared object: the interpreter, the kernel, each C extension.

On a shared machine whose speed drifts from one minute to the next, alternating two versions
is not enough: ``--against /tmp/wt-X/src`` measures that code and this one **at the same
time** (``--pairs`` times), both slowed alike by sharing the cores, and prints each pair's
ratio; only the ratio means anything then.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


async def measure(mode: str, calls: int, callers: int, sequential: int, perf: Path | None = None) -> str:
    async with overhead.in_child("upstream", "") as upstream:
        others = {p.pid for p in multiprocessing.active_children()}
        async with overhead.in_child("agent-gateway", upstream) as url:
            pid = next(p.pid for p in multiprocessing.active_children() if p.pid and p.pid not in others)
            scenario = overhead.Scenario("agent-gateway", "up__echo")
            await overhead.concurrent(url, scenario, callers, 20, mode)  # warm
            with recorded(pid, perf):
                cpu, started = cpu_seconds(pid), time.perf_counter()
                loaded = await overhead.concurrent(url, scenario, callers, calls // callers, mode)
                cpu, seconds = cpu_seconds(pid) - cpu, time.perf_counter() - started
            alone = await overhead.sequential(url, scenario, sequential, mode)
    return (
        f"| {revision()} | {mode} | {loaded.calls} | {cpu / loaded.calls * 1e3:.3f} | "
        f"{loaded.calls / seconds:.0f} | {alone.percentile(50):.2f} |"
    )


@contextmanager
def recorded(pid: int, path: Path | None) -> Iterator[None]:
    """With ``path``: ``perf record`` of process ``pid`` (every thread, the kernel's share
    included) over the block, into ``path``; the loaded phase is what is recorded."""
    if path is None:
        yield
        return
    recorder = subprocess.Popen(
        ["perf", "record", "-F", "1999", "-p", str(pid), "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # perf writes its file and exits
        recorder.wait(30)


def by_library(path: Path, rows: int = 12) -> str:
    """Where the recorded CPU went, by shared object (the interpreter, the kernel, C extensions)."""
    report = subprocess.run(
        ["perf", "report", "-i", str(path), "--sort", "dso", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shares = [m.groups() for m in _SHARE.finditer(report)][:rows]
    lines = ["| share of the gateway's CPU | shared object |", "|---:|---|"]
    return "\n".join(lines + [f"| {share} | `{name}` |" for share, name in shares])


_SHARE = re.compile(r"^\s*([0-9.]+%)\s+(\S+)\s*$", re.M)


_ROW = re.compile(r"^\| \S+ \| (?:legacy|auto) \| \d+ \| ([0-9.]+) \| (\d+) \| ([0-9.]+) \|$", re.M)


def _result(printed: str, pair: int) -> re.Match[str]:
    row = _ROW.search(printed)
    if row is None:
        raise SystemExit(f"pair {pair}: a run printed no result:\n{printed}")
    return row


def against(base: str, args: argparse.Namespace) -> None:
    """This code and the code at ``base`` (a ``src`` directory) measured side by side."""
    own = [sys.executable, __file__, "--mode", args.mode, "--calls", str(args.calls)]
    own += ["--callers", str(args.callers), "--sequential", str(args.sequential)]
    print("| pair | code | gateway CPU ms per call | calls/s | sequential p50 ms | CPU after / before |")
    print("|---:|---|---:|---:|---:|---:|")
    ratios: list[float] = []
    for pair in range(1, args.pairs + 1):
        runs = [
            subprocess.Popen(own, stdout=subprocess.PIPE, text=True, env=os.environ | extra)
            for extra in ({"PYTHONPATH": base}, {})
        ]
        rows = [_result(run.communicate()[0], pair) for run in runs]
        before, after = (float(row.group(1)) for row in rows)
        ratios.append(after / before)
        for name, row in zip(("before", "after"), rows, strict=True):
            print(f"| {pair} | {name} | {row.group(1)} | {row.group(2)} | {row.group(3)} |  |")
        print(f"| {pair} | | | | | **{after / before - 1:+.1%}** |")
    print(f"\nmean CPU change: {sum(ratios) / len(ratios) - 1:+.1%} over {len(ratios)} pairs")
    print(f"\ncommand: `.venv/bin/python bench/cpu_per_call.py {shlex.join(sys.argv[1:])}`")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mode", default="legacy", help="legacy (handshake era, default) or auto (modern)")
    parser.add_argument("--calls", type=int, default=3000, help="calls in all, under load (default 3000)")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers (default 16)")
    parser.add_argument(
        "--sequential", type=int, default=200, help="sequential calls for the p50 (default 200)"
    )
    parser.add_argument("--against", help="another src directory, measured at the same time (the baseline)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs measured with --against (default 3)")
    parser.add_argument("--perf", type=Path, help="record the loaded phase with Linux perf into this file")
    args = parser.parse_args()
    if args.against:
        against(args.against, args)
        return
    overhead.quiet_logging()
    row = anyio.run(measure, args.mode, args.calls, args.callers, args.sequential, args.perf)
    print("| code | era | calls | gateway CPU ms per call | calls/s | sequential p50 ms |")
    print("|---|---|---:|---:|---:|---:|")
    print(row)
    if args.perf is not None:
        print(f"\n{by_library(args.perf)}")
    print(f"\ncommand: `.venv/bin/python bench/cpu_per_call.py {shlex.join(sys.argv[1:])}`")


if __name__ == "__main__":
    main()
