"""What a hop through agent-gateway costs: ``tools/call`` round trips to one upstream.

Four ways of reaching the same inline FastMCP upstream (tool ``echo``) over Streamable HTTP
on loopback, each measured sequentially (one session, one call after another) and with
``--concurrency`` callers (one session each) calling at once:

- ``direct``: the official ``mcp.Client`` straight to the upstream;
- ``agent-gateway``: ``mcp.Client`` to the gateway, which forwards over its one upstream session;
- ``fastmcp-proxy (reused)``: ``fastmcp.server.create_proxy`` around one long-lived,
  already-connected ``fastmcp.Client`` (FastMCP's fastest proxy configuration);
- ``fastmcp-proxy (default)``: ``create_proxy(url)``, which opens a new upstream session per call.

By default every server shares this process's event loop (so the numbers compare CPU cost per
call on one core); ``--isolate`` runs each server in its own process instead, as deployed.

Run from the repository root::

    .venv/bin/python bench/overhead.py [--calls 300] [--concurrency 32] [--mode legacy|auto]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import math
import multiprocessing
import os
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import anyio
from fastmcp import Client as FastMCPClient
from fastmcp import FastMCP
from fastmcp.server import create_proxy
from mcp import Client

from agent_gateway.config import parse_config
from agent_gateway.http import build_app
from agent_gateway.server import Gateway

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `tests` importable
from tests.support import serving

STARTUP_BOUND = 30.0
"""Seconds a server (or a child process serving one) may take to start."""
STOP_BOUND = 15.0
PROFILE_ENV = "AGW_BENCH_PROFILE"
"""With ``--isolate``: a directory where each server child writes ``<role>.prof`` (cProfile)."""
MEASURE_BOUND = 150.0
"""Seconds one measurement (one scenario, one shape, warm-up included) may take."""
CALL_TIMEOUT = 30.0
WARMUP_CALLS = 20
SLOW_SHARE = 0.2
"""The share of the call budget the default FastMCP proxy gets: it is far slower per call."""
QUIET = ("uvicorn", "uvicorn.error", "uvicorn.access", "fastmcp", "mcp", "httpx", "agent_gateway")

Serve = Callable[[str], AbstractAsyncContextManager[str]]
"""Given the upstream's URL, serve one way of reaching it; yield the URL clients call."""


# -- servers ------------------------------------------------------------------------------


def make_upstream() -> FastMCP:
    upstream = FastMCP("bench-upstream")

    @upstream.tool
    def echo(text: str) -> str:
        """Return ``text`` unchanged."""
        return text

    return upstream


@asynccontextmanager
async def upstream_server(_: str = "") -> AsyncIterator[str]:
    async with serving(make_upstream().http_app(path="/mcp")) as base:
        yield f"{base}/mcp"


@asynccontextmanager
async def direct(upstream: str) -> AsyncIterator[str]:
    yield upstream


@asynccontextmanager
async def via_gateway(upstream: str) -> AsyncIterator[str]:
    config = parse_config({"upstreams": {"up": {"url": upstream}}}, {}, source="bench")
    gateway = Gateway(config)
    async with gateway.running(settle_timeout=STARTUP_BOUND), serving(build_app(gateway)) as base:
        yield f"{base}{config.server.path}"


@asynccontextmanager
async def via_fastmcp_reused(upstream: str) -> AsyncIterator[str]:
    # A connected plain fastmcp.Client makes create_proxy reuse its one session for every call.
    async with FastMCPClient(upstream, timeout=CALL_TIMEOUT) as backend:
        proxy = create_proxy(backend, name="fastmcp-proxy-reused")
        async with serving(proxy.http_app(path="/mcp")) as base:
            yield f"{base}/mcp"


@asynccontextmanager
async def via_fastmcp_default(upstream: str) -> AsyncIterator[str]:
    async with serving(create_proxy(upstream, name="fastmcp-proxy").http_app(path="/mcp")) as base:
        yield f"{base}/mcp"


SERVERS: dict[str, Serve] = {
    "upstream": upstream_server,
    "agent-gateway": via_gateway,
    "fastmcp-proxy (reused)": via_fastmcp_reused,
    "fastmcp-proxy (default)": via_fastmcp_default,
}


# -- servers in child processes (--isolate) -------------------------------------------------


def _child_main(role: str, upstream: str, conn: Connection) -> None:
    quiet_logging()
    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        anyio.run(_child_serve, role, upstream, conn)
        return
    # One cProfile per isolated server: where its time goes, open with pstats or snakeviz.
    profiler = cProfile.Profile()
    profiler.runcall(anyio.run, _child_serve, role, upstream, conn)
    slug = "".join(c if c.isalnum() else "-" for c in role)
    profiler.dump_stats(Path(profile_dir) / f"{slug}.prof")


async def _child_serve(role: str, upstream: str, conn: Connection) -> None:
    try:
        async with SERVERS[role](upstream) as url:
            conn.send(("url", url))
            with suppress(EOFError):
                await anyio.to_thread.run_sync(conn.recv)  # the parent's "stop", or its exit
    except Exception as exc:
        with suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


@asynccontextmanager
async def in_child(role: str, upstream: str) -> AsyncIterator[str]:
    """Serve ``role`` in a child process of its own; stop and reap it on exit."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_child_main, args=(role, upstream, child), daemon=True)
    process.start()
    child.close()
    try:
        if not await anyio.to_thread.run_sync(parent.poll, STARTUP_BOUND):
            raise TimeoutError(f"{role}: child did not start within {STARTUP_BOUND:g}s")
        kind, value = parent.recv()
        if kind != "url":
            raise RuntimeError(f"{role}: child failed: {value}")
        yield value
    finally:
        with suppress(OSError):
            parent.send("stop")
        await anyio.to_thread.run_sync(process.join, STOP_BOUND)
        if process.is_alive():
            process.kill()
            await anyio.to_thread.run_sync(process.join, STOP_BOUND)
        parent.close()


def server_for(role: str, isolate: bool) -> Serve:
    if role == "direct":
        return direct
    if not isolate:
        return SERVERS[role]

    def isolated(upstream: str) -> AbstractAsyncContextManager[str]:
        return in_child(role, upstream)

    return isolated


# -- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    tool: str
    share: float = 1.0


SCENARIOS = (
    Scenario("direct", "echo"),
    Scenario("agent-gateway", "up__echo"),
    Scenario("fastmcp-proxy (reused)", "echo"),
    Scenario("fastmcp-proxy (default)", "echo", share=SLOW_SHARE),
)


@dataclass
class Result:
    scenario: str
    shape: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    protocol: str = ""

    @property
    def calls(self) -> int:
        return len(self.latencies)

    @property
    def throughput(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the latencies, in milliseconds."""
        ordered = sorted(self.latencies)
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return ordered[rank - 1] * 1e3


def new_client(url: str, mode: str) -> Client:
    return Client(url, mode=mode, read_timeout_seconds=CALL_TIMEOUT)


async def timed_call(client: Client, tool: str, text: str) -> float:
    """One ``tools/call``; its round-trip time in seconds. Raises if the echo is wrong."""
    started = time.perf_counter()
    result = await client.call_tool(tool, {"text": text})
    elapsed = time.perf_counter() - started
    content = result.content[0] if result.content else None
    if result.is_error or getattr(content, "text", None) != text:
        raise RuntimeError(f"{tool}: unexpected result {result!r}")
    return elapsed


async def warm_up(client: Client, tool: str, calls: int) -> None:
    await client.list_tools()
    for i in range(calls):
        await timed_call(client, tool, f"warm {i}")


async def sequential(url: str, scenario: Scenario, calls: int, mode: str) -> Result:
    result = Result(scenario.name, "sequential")
    async with new_client(url, mode) as client:
        result.protocol = client.protocol_version
        await warm_up(client, scenario.tool, WARMUP_CALLS)
        started = time.perf_counter()
        for i in range(calls):
            result.latencies.append(await timed_call(client, scenario.tool, f"seq {i}"))
        result.seconds = time.perf_counter() - started
    return result


@dataclass
class Starter:
    """Holds ``callers`` back until all are connected and warm, then releases them at once."""

    callers: int
    ready: int = 0
    all_ready: anyio.Event = field(default_factory=anyio.Event)
    go: anyio.Event = field(default_factory=anyio.Event)
    started: float = 0.0
    finished: list[float] = field(default_factory=list)

    async def arrive(self) -> None:
        self.ready += 1
        if self.ready == self.callers:
            self.all_ready.set()
        await self.go.wait()

    async def release(self) -> None:
        await self.all_ready.wait()
        self.started = time.perf_counter()
        self.go.set()


async def caller(
    url: str, mode: str, tool: str, calls: int, index: int, starter: Starter, out: Result
) -> None:
    async with new_client(url, mode) as client:
        out.protocol = client.protocol_version
        await warm_up(client, tool, 2)
        await starter.arrive()
        for i in range(calls):
            out.latencies.append(await timed_call(client, tool, f"c{index} {i}"))
        starter.finished.append(time.perf_counter())


async def concurrent(url: str, scenario: Scenario, callers: int, per_caller: int, mode: str) -> Result:
    result = Result(scenario.name, f"{callers} concurrent")
    starter = Starter(callers)
    async with anyio.create_task_group() as tg:
        for index in range(callers):
            tg.start_soon(caller, url, mode, scenario.tool, per_caller, index, starter, result)
        await starter.release()
    result.seconds = max(starter.finished) - starter.started
    return result


@dataclass(frozen=True)
class Options:
    calls: int
    concurrency: int
    per_caller: int
    mode: str
    isolate: bool


async def measure(scenario: Scenario, upstream: str, options: Options) -> list[Result]:
    calls = max(1, round(options.calls * scenario.share))
    per_caller = max(1, round(options.per_caller * scenario.share))
    async with server_for(scenario.name, options.isolate)(upstream) as url:
        with anyio.fail_after(MEASURE_BOUND):
            seq = await sequential(url, scenario, calls, options.mode)
        with anyio.fail_after(MEASURE_BOUND):
            conc = await concurrent(url, scenario, options.concurrency, per_caller, options.mode)
    return [seq, conc]


async def run(options: Options) -> list[Result]:
    results: list[Result] = []
    async with server_for("upstream", options.isolate)("") as upstream:
        for scenario in SCENARIOS:
            print(f"measuring {scenario.name} ...", file=sys.stderr, flush=True)
            results += await measure(scenario, upstream, options)
    return results


# -- reporting ------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    lines = [
        "| scenario | callers | calls | calls/s | p50 ms | p99 ms | protocol |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario} | {r.shape} | {r.calls} | {r.throughput:,.0f} "
            f"| {r.percentile(50):.2f} | {r.percentile(99):.2f} | {r.protocol} |"
        )
    return "\n".join(lines)


def verdicts(results: list[Result], concurrency: int) -> str:
    def pick(scenario: str, shape: str) -> Result:
        return next(r for r in results if r.scenario == scenario and r.shape == shape)

    many = f"{concurrency} concurrent"
    gateway, straight, reused = (pick(s, many) for s in ("agent-gateway", "direct", "fastmcp-proxy (reused)"))
    share = gateway.throughput / straight.throughput
    speedup = gateway.throughput / reused.throughput
    added = pick("agent-gateway", "sequential").percentile(50) - pick("direct", "sequential").percentile(50)
    return "\n".join(
        [
            "| ratio | measured | target | met |",
            "|---|---:|---:|---|",
            f"| agent-gateway / direct throughput, {many} | {share:.0%} | >= 60% | {_yes(share >= 0.6)} |",
            f"| agent-gateway / fastmcp-proxy (reused) throughput, {many} "
            f"| {speedup:.2f}x | >= 1.5x | {_yes(speedup >= 1.5)} |",
            f"| agent-gateway p50 - direct p50, sequential | {added:+.2f} ms | <= 3 ms | {_yes(added <= 3)} |",
        ]
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


# -- entry point ----------------------------------------------------------------------------


def quiet_logging() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per scenario (default 300)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent callers (default 32)")
    parser.add_argument("--per-caller", type=int, default=20, help="calls per concurrent caller (default 20)")
    parser.add_argument(
        "--mode",
        default="legacy",
        help="the benchmark clients' connect mode: legacy (handshake era, default) or auto (modern era)",
    )
    parser.add_argument("--isolate", action="store_true", help="run each server in its own process")
    args = parser.parse_args(argv)
    return Options(args.calls, args.concurrency, args.per_caller, args.mode, args.isolate)


def main() -> None:
    options = parse_args()
    quiet_logging()
    results = anyio.run(run, options)
    print(table(results))
    print()
    print(verdicts(results, options.concurrency))
    print()
    print(f"command: `{shlex.join(sys.orig_argv)}`")
    layout = "each server in its own process" if options.isolate else "all servers in one event loop"
    print(f"layout: {layout}; warm-up {WARMUP_CALLS} calls per sequential session, 2 per concurrent one")


if __name__ == "__main__":
    main()
