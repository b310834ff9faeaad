"""Greedy clients keeping an upstream full, and a client arriving meanwhile.

``--hogs`` bearer-token clients each keep ``--each`` calls of a quick tool (100 ms) in flight
to one upstream (FastMCP, loopback Streamable HTTP, ``max_concurrency`` ``--cap``, the
default share), sending a call again as soon as it ends and a refused one 50 ms later, as a
client retrying does. Meanwhile a client arriving makes ``--calls`` sequential calls of
``echo`` on the same upstream. Printed: its calls served, p50 and p99 of those served, the
upstream's calls in flight on average while it called, and the hogs' calls served and refused.
``--session per_client`` gives each client a dedicated upstream session of its own (the same
server, each its own MCP session) in place of the shared one.

One process holds the upstream, the gateway and the clients. The code measured is the one
first on ``PYTHONPATH``; ``--against SRC`` runs the same scenario on the code in ``SRC`` as
well (a worktree's ``src``), each in a child process of its own, one after the other::

    .venv/bin/python bench/upstream_full.py [--against /tmp/wt/src]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from fastmcp import FastMCP
from mcp import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: make `bench` and `tests` importable
from bench.upstream_share import client  # noqa: E402  (a client with a connection per call)
from tests.support import running_gateway, serving_upstream  # noqa: E402

from agent_gateway.upstreams import queueing  # noqa: E402

QUICK = 0.1
"""Seconds the hogs' tool takes."""
RETRY = 0.05
"""Seconds a hog waits before sending a refused call again."""


def _server() -> FastMCP:
    server = FastMCP("busy")

    @server.tool
    async def quick() -> str:
        await anyio.sleep(QUICK)
        return "done"

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


def _config(url: str, hogs: int, cap: int, session: str) -> dict[str, Any]:
    tokens = [{"name": "arriving", "token": "${A}"}]
    tokens += [{"name": f"hog{n}", "token": "${H" + str(n) + "}"} for n in range(hogs)]
    auth = {"mode": "bearer", "tokens": tokens}
    upstream = {"url": url, "max_concurrency": cap, "session": session, "max_sessions": hogs + 1}
    return {"upstreams": {"busy": upstream}, "auth": auth}


def _environ(hogs: int) -> dict[str, str]:
    return {"A": "arriving-token-0123456789"} | {f"H{n}": f"hog-{n}-token-0123456789" for n in range(hogs)}


async def _hog(c: Client, calls: int, stop: anyio.Event, tally: dict[str, int]) -> None:
    async def one() -> None:
        while not stop.is_set():
            result = await c.call_tool("busy__quick", {})
            tally["refused" if result.is_error else "served"] += 1
            if result.is_error:
                await anyio.sleep(RETRY)

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)


async def _arriving(c: Client, calls: int, in_flight: Any) -> tuple[list[float], list[int]]:
    """The milliseconds each call served took, and the upstream's calls in flight as each began."""
    waits, seen = [], []
    for n in range(calls):
        seen.append(in_flight())
        began = time.perf_counter()
        result = await c.call_tool("busy__echo", {"text": str(n)})
        block = result.content[0]
        if not result.is_error and isinstance(block, types.TextContent) and block.text == str(n):
            waits.append((time.perf_counter() - began) * 1e3)
    return waits, seen


async def scenario(hogs: int, each: int, cap: int, calls: int, session: str) -> dict[str, Any]:
    environ = _environ(hogs)
    tally = {"served": 0, "refused": 0}
    stop = anyio.Event()
    waits: list[float] = []
    seen, during = [0], dict(tally)
    async with (
        serving_upstream(_server()) as url,
        running_gateway(_config(url, hogs, cap, session), environ=environ) as gw,
        AsyncExitStack() as stack,
    ):
        guard = gw.gateway.pool.get("busy").guard
        arriving = await stack.enter_async_context(client(gw.url, environ["A"]))
        clients = [await stack.enter_async_context(client(gw.url, environ[f"H{n}"])) for n in range(hogs)]
        async with anyio.create_task_group() as tg:
            for hog in clients:
                tg.start_soon(_hog, hog, each, stop, tally)
            with anyio.fail_after(30):
                while hogs and guard.in_flight < min(cap, hogs * each):  # the hogs fill it
                    await anyio.sleep(0.05)
            before = dict(tally)
            waits, seen = await _arriving(arriving, calls, lambda: guard.in_flight)
            during = {k: tally[k] - before[k] for k in tally}
            stop.set()
    return {"waits": waits, "in_flight": statistics.mean(seen), "hogs": during}


def _row(name: str, result: dict[str, Any], calls: int) -> str:
    waits = result["waits"]
    if waits:
        p99 = statistics.quantiles(waits, n=100)[98] if len(waits) > 1 else waits[0]
        latency = f"{statistics.median(waits):.1f} / {p99:.1f} ms"
    else:
        latency = "none served"
    hogs = result["hogs"]
    return (
        f"| {name} | {len(waits)}/{calls} | {latency} | {result['in_flight']:.1f} | "
        f"{hogs['served']} / {hogs['refused']} |"
    )


def _child(src: str, argv: list[str]) -> list[dict[str, Any]]:
    environ = os.environ | {"PYTHONPATH": os.pathsep.join([src, str(ROOT)])}
    out = subprocess.run(
        [sys.executable, __file__, "--child", *argv], env=environ, capture_output=True, text=True, check=True
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


async def _measure(args: argparse.Namespace) -> None:
    # The upstream serves in this process, beside every client: its pings come back late as
    # this process is busy, and the window (which a separate upstream's fast pings keep whole)
    # would hold calls back under the cap. A ping must be a second late to narrow it here, as
    # in tests/security/test_upstream_share.py: the cap is what is measured.
    queueing.TARGET = 1.0
    for hogs in (0, args.hogs):
        result = await scenario(hogs, args.each, args.cap, args.calls, args.session)
        print(json.dumps({"clients": hogs} | result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hogs", type=int, default=24, help="greedy clients")
    parser.add_argument("--each", type=int, default=1, help="each one's calls kept in flight")
    parser.add_argument("--cap", type=int, default=16, help="the upstream's max_concurrency")
    parser.add_argument("--calls", type=int, default=100, help="the arriving client's sequential calls")
    parser.add_argument("--session", default="shared", help="the upstream's session: shared or per_client")
    parser.add_argument("--against", help="another version's src, measured the same way")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        anyio.run(_measure, args)
        return
    print("command: .venv/bin/python bench/upstream_full.py " + shlex.join(sys.argv[1:]))
    print()
    print(
        "| code, hogs | arriving client's calls served | p50 / p99 | upstream's calls in flight | hogs' calls served / refused meanwhile |"
    )
    print("|---|---|---|---:|---|")
    argv = [f"--hogs={args.hogs}", f"--each={args.each}", f"--cap={args.cap}", f"--calls={args.calls}"]
    argv.append(f"--session={args.session}")
    versions = [("this", str(ROOT / "src"))] + ([("against", args.against)] if args.against else [])
    for label, src in versions:
        for result in _child(src, argv):
            print(_row(f"{label}, {result['clients']} hogs", result, args.calls), flush=True)


if __name__ == "__main__":
    main()
