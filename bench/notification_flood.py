"""The gateway's CPU while an upstream sends notifications without pause, read at its
``notification_rate`` (1,000 a second by default): of a method MCP does not define (which
nothing reads) and log lines (relayed to the caller).

The gateway runs as ``agent-gateway serve`` runs it, in a child process; the upstream is
``tests/servers/noisy.py`` over stdio, whose ``flood`` tool writes ``--lines`` notifications
before its answer; the figure is the gateway child's CPU (user + system, from ``/proc``) over
that call, per 1,000 notifications. ``--against /tmp/wt-X/src`` runs that code and this one
side by side (``--pairs`` times) and prints each pair's ratio: on a shared machine only the
ratio means anything.

    .venv/bin/python bench/notification_flood.py --against /tmp/wt-X/src
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: `tests` importable
from tests.support import gateway_child, python_upstream

METHODS = {"unknown": "notifications/x-vendor/tick", "log": "notifications/message"}
_ROW = re.compile(r"^RESULT (\S+) ([\d.]+) ([\d.]+)$", re.MULTILINE)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(kind: str, lines: int) -> tuple[float, float]:
    """The gateway's CPU ms per 1,000 notifications of ``kind``, and the call's seconds."""
    config = {"upstreams": {"noisy": python_upstream("noisy.py", timeout=300)}, "agent": {"enabled": False}}
    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "gateway.log"
        async with (
            gateway_child(config, Path(directory), log) as (base, child),
            Client(f"{base}/mcp") as client,
        ):
            arguments = {"lines": lines, "size": 40, "during": True, "method": METHODS[kind]}
            used, started = cpu_seconds(child.pid), time.perf_counter()
            await client.call_tool("noisy__flood", arguments)
            took = time.perf_counter() - started
            used = cpu_seconds(child.pid) - used
    return used * 1e3 / (lines / 1000), took


def _result(printed: str, pair: int) -> tuple[float, float]:
    row = _ROW.search(printed)
    if row is None:
        raise SystemExit(f"pair {pair}: a run printed no result:\n{printed}")
    return float(row.group(2)), float(row.group(3))


def against(base: str, args: argparse.Namespace) -> None:
    """This code and the code at ``base`` (a ``src`` directory) measured side by side."""
    print("| pair | kind | CPU ms per 1,000: before | after | after / before | call s: before | after |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for pair in range(1, args.pairs + 1):
        for kind in METHODS:
            own = [sys.executable, __file__, "--kind", kind, "--lines", str(args.lines)]
            runs = [
                subprocess.Popen(own, stdout=subprocess.PIPE, text=True, env=os.environ | extra)
                for extra in ({"PYTHONPATH": base}, {})
            ]
            (before, before_s), (after, after_s) = (_result(run.communicate()[0], pair) for run in runs)
            print(
                f"| {pair} | {kind} | {before:.0f} | {after:.0f} | **{after / before:.2f}** "
                f"| {before_s:.1f} | {after_s:.1f} |"
            )
    print(f"\ncommand: `.venv/bin/python bench/notification_flood.py {shlex.join(sys.argv[1:])}`")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kind", choices=sorted(METHODS), default="unknown")
    parser.add_argument("--lines", type=int, default=8000, help="notifications in the flood (default 8000)")
    parser.add_argument("--against", help="another src directory, measured at the same time (the baseline)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs measured with --against (default 3)")
    args = parser.parse_args()
    if args.against:
        against(args.against, args)
        return
    per_thousand, took = anyio.run(measure, args.kind, args.lines)
    print(f"RESULT {args.kind} {per_thousand:.1f} {took:.2f}")


if __name__ == "__main__":
    main()
