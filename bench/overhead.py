"""What a hop through agent-gateway costs: ``tools/call`` round trips to one upstream.

Five ways of reaching the same inline FastMCP upstream (tool ``echo``) over Streamable HTTP
on loopback, each measured sequentially (one session, one call after another) and with
``--concurrency`` callers (one session each) calling at once:

- ``direct``: the official ``mcp.Client`` straight to the upstream;
- ``tcp relay``: through a process that only copies bytes (``bench/relay.py``), the floor of
  any hop: what one more process on the path costs this machine, whatever it does (with
  ``--one-loop``, only what relaying the bytes costs: it is a coroutine of the same loop then);
- ``agent-gateway``: ``mcp.Client`` to the gateway, which forwards over its one upstream session;
- ``fastmcp-proxy (reused)``: ``fastmcp.server.create_proxy`` around one long-lived,
  already-connected ``fastmcp.Client`` (FastMCP's fastest proxy configuration);
- ``fastmcp-proxy (default)``: ``create_proxy(url)``, which opens a new upstream session per call.

By default each server runs in a process of its own, as deployed: the gateway as
``agent-gateway serve`` runs it (uvloop, its heap settled once up: ``agent_gateway.runtime``),
the upstream and FastMCP's proxies as FastMCP runs a server. ``--one-loop`` serves everything
in this process's one event loop instead, so the numbers compare CPU cost per call on one core.

``--traced`` adds two rows, both always in a process of their own: ``agent-gateway (isolated)``
(the gateway, untraced) and ``agent-gateway (traced)`` (the same, with the OpenTelemetry SDK
installed: every trace sampled, spans exported over OTLP/HTTP to a local receiver, metrics on),
and reports tracing's cost as same-run ratios of the two.

Run from the repository root::

    .venv/bin/python bench/overhead.py [--calls 300] [--concurrency 32] [--mode legacy|auto] [--one-loop] [--traced]
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
import tempfile
import threading
import time
from collections import Counter
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

from agent_gateway import runtime
from agent_gateway.config import TelemetryConfig
from agent_gateway.config_files import parse_config
from agent_gateway.exporters import install
from agent_gateway.http import build_app
from agent_gateway.server import Gateway
from agent_gateway.serving import listener_options

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `tests` importable
from bench.relay import relay
from tests.otlp import otlp_receiver
from tests.support import serving

STARTUP_BOUND = 30.0
"""Seconds a server (or a child process serving one) may take to start."""
STOP_BOUND = 15.0
PROFILE_ENV = "AGW_BENCH_PROFILE"
"""In the processes layout: a directory where each server child writes ``<role>.prof`` (cProfile)."""
MEASURE_BOUND = 150.0
"""Seconds one measurement (one scenario, one shape, warm-up included) may take."""
CALL_TIMEOUT = 30.0
WARMUP_CALLS = 20
SLOW_SHARE = 0.2
"""The share of the call budget the default FastMCP proxy gets: it is far slower per call."""
QUIET = ("uvicorn", "uvicorn.error", "uvicorn.access", "fastmcp", "mcp", "httpx", "agent_gateway")

Serve = Callable[[str], AbstractAsyncContextManager[str]]
"""Given the upstream's URL, serve one way of reaching it; yield the URL clients call."""
ChildStats = dict[str, float]
"""What a server child reports when it stops: ``cpu_s`` (the CPU time of the whole process,
every thread, from serving its URL until stopped) and, from the OTLP receiver, what it received."""

ISOLATED = "agent-gateway (isolated)"
UNAUDITED = "agent-gateway (audit off)"
REUSED_TUNED = "fastmcp-proxy (reused, gateway's runtime)"
RELAY = "tcp relay"
"""A process that only copies bytes (``bench/relay.py``): what one more hop costs, the floor."""
TRACED = "agent-gateway (traced)"
RECEIVER = "otlp-receiver"
SPAN_PREFIX = "span "
"""Receiver stats keyed ``span <name>`` count the spans received by name."""
THREAD_PREFIX = "thread "
"""Child stats keyed ``thread <name>``: CPU seconds of its threads but the main one, by name."""


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
async def via_gateway(upstream: str, audit: bool = True) -> AsyncIterator[str]:
    # The audit trail is on by default. It and the agent's memory (which holds the tool pins)
    # go to a directory of this gateway's own: several gateways run at once (--traced).
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as home:
        data = {
            "upstreams": {"up": {"url": upstream}},
            "audit": {"enabled": audit, "path": str(Path(home) / "audit.jsonl")},
            "agent": {"memory": {"path": str(Path(home) / "conversations.sqlite")}},
        }
        config = parse_config(data, {}, source="bench")
        gateway = Gateway(config)
        # Its listener as `serve` runs it: uvicorn's protocol with the connection bounds.
        listening = listener_options(gateway)
        async with (
            gateway.running(settle_timeout=STARTUP_BOUND),
            serving(build_app(gateway), **listening) as base,
        ):
            yield f"{base}{config.server.path}"


@asynccontextmanager
async def via_gateway_unaudited(upstream: str) -> AsyncIterator[str]:
    async with via_gateway(upstream, audit=False) as url:
        yield url


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


CHILD_STATS: ChildStats = {}
"""In a server child: what its server adds to the report it sends when stopped."""


@asynccontextmanager
async def otlp_collector(_: str = "") -> AsyncIterator[str]:
    """The tests' OTLP/HTTP receiver; yield its base URL, count what it got into ``CHILD_STATS``."""
    async with otlp_receiver() as (base, received):
        try:
            yield base
        finally:
            CHILD_STATS.update(
                spans=len(received.spans),
                trace_requests=received.trace_requests,
                metric_requests=received.metric_requests,
                rejected=received.rejected,
            )
            names = Counter(span.name for span in received.spans)
            CHILD_STATS.update({f"{SPAN_PREFIX}{name}": n for name, n in names.items()})


SERVERS: dict[str, Serve] = {
    "upstream": upstream_server,
    "agent-gateway": via_gateway,
    UNAUDITED: via_gateway_unaudited,
    "fastmcp-proxy (reused)": via_fastmcp_reused,
    REUSED_TUNED: via_fastmcp_reused,
    "fastmcp-proxy (default)": via_fastmcp_default,
    RELAY: relay,
}
CHILD_ONLY: dict[str, Serve] = {
    ISOLATED: via_gateway,
    TRACED: via_gateway,  # in a child whose SDK providers ``install`` has set (see traced_gateway)
    RECEIVER: otlp_collector,
}
"""Roles that always run in a child process, whatever the layout."""
GATEWAYS = frozenset({"agent-gateway", UNAUDITED, ISOLATED, TRACED, REUSED_TUNED, RELAY})
"""Roles whose child runs as ``agent-gateway serve`` runs: uvloop, and the heap settled once up
(``agent_gateway.runtime``). The others run as FastMCP runs a server: asyncio, default GC.
``REUSED_TUNED`` is FastMCP's reused proxy given the gateway's process settings too, so the
comparison can be read without them; the relay runs with them too (the floor of a hop as the
gateway would make it)."""


def serve_of(role: str) -> Serve:
    return SERVERS[role] if role in SERVERS else CHILD_ONLY[role]


# -- servers in child processes (the default layout) --------------------------------------------


def _child_main(role: str, upstream: str, conn: Connection, otlp_endpoint: str | None) -> None:
    quiet_logging()
    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        _run_child(role, upstream, conn, otlp_endpoint)
        return
    # One cProfile per isolated server: where its time goes, open with pstats or snakeviz.
    profiler = cProfile.Profile()
    profiler.runcall(_run_child, role, upstream, conn, otlp_endpoint)
    slug = "".join(c if c.isalnum() else "-" for c in role)
    profiler.dump_stats(Path(profile_dir) / f"{slug}.prof")


def _run_child(role: str, upstream: str, conn: Connection, otlp_endpoint: str | None) -> None:
    if role in GATEWAYS:
        runtime.run(_child_serve, role, upstream, conn, otlp_endpoint)
    else:
        anyio.run(_child_serve, role, upstream, conn, otlp_endpoint)


async def _child_serve(role: str, upstream: str, conn: Connection, otlp_endpoint: str | None) -> None:
    # With an endpoint: this process's SDK providers, set before the app is built (as `serve`
    # does), so the gateway's spans and metrics are recorded and exported from the start.
    telemetry = (
        install(
            TelemetryConfig(otlp_endpoint=otlp_endpoint, sampling_ratio=1.0, metrics=True), {}, scraped=True
        )
        if otlp_endpoint
        else None
    )
    started = 0.0
    try:
        if role in GATEWAYS:
            runtime.prepare_heap()  # as serve does
        async with serve_of(role)(upstream) as url:
            if role in GATEWAYS:
                runtime.settle_heap()
            conn.send(("url", url))
            started = time.process_time()
            with suppress(EOFError):
                await anyio.to_thread.run_sync(conn.recv)  # the parent's "stop", or its exit
            CHILD_STATS.update(thread_cpu())  # before the SDK's export threads end at shutdown
        if telemetry is not None:
            telemetry.shutdown()  # export the spans still batched: part of what tracing costs
        with suppress(OSError):
            conn.send(("stats", {"cpu_s": time.process_time() - started, **CHILD_STATS}))
    except Exception as exc:
        with suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def thread_cpu() -> ChildStats:
    """CPU seconds of this process's live threads but the main one, by name (Linux only).

    The OpenTelemetry SDK exports from threads of its own (``OtelBatchSpanRecordProcessor``),
    which hold the GIL while they encode: this is how much CPU they took from the event loop.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: ChildStats = {}
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.native_id is None:
            continue
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": fields 3 onwards
        key = f"{THREAD_PREFIX}{thread.name}"
        cpu[key] = cpu.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return cpu


@asynccontextmanager
async def in_child(
    role: str, upstream: str, *, otlp_endpoint: str | None = None, stats: ChildStats | None = None
) -> AsyncIterator[str]:
    """Serve ``role`` in a child process of its own; stop and reap it on exit.

    With ``otlp_endpoint`` the child installs tracing (sampling 1.0) and metrics exporting there.
    ``stats`` receives what the child reports when it stops (see ``ChildStats``).
    """
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_child_main, args=(role, upstream, child, otlp_endpoint), daemon=True)
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
        with suppress(EOFError, OSError):
            if await anyio.to_thread.run_sync(parent.poll, STOP_BOUND):
                kind, value = parent.recv()
                if kind == "stats" and stats is not None:
                    stats.update(value)
                elif kind == "error":
                    print(f"{role}: child failed while stopping: {value}", file=sys.stderr, flush=True)
        await anyio.to_thread.run_sync(process.join, STOP_BOUND)
        if process.is_alive():
            process.kill()
            await anyio.to_thread.run_sync(process.join, STOP_BOUND)
        parent.close()


@asynccontextmanager
async def traced_gateway(upstream: str, stats: ChildStats, received: ChildStats) -> AsyncIterator[str]:
    """The gateway with tracing and metrics on, in a child, exporting to a receiver in another.

    The receiver gets a process of its own: in the gateway's child it would share (and steal)
    the gateway's one event loop, and this process is not idle either: its loop runs every
    benchmark client (and, with ``--one-loop``, the upstream), so a receiver there would
    delay the very calls being timed. A process of its own is what a collector is in
    deployment; it only competes for the machine's cores, and it reports what it received
    (and its CPU time) when stopped. It stops last, after the gateway has flushed its spans.
    """
    async with (
        in_child(RECEIVER, "", stats=received) as endpoint,
        in_child(TRACED, upstream, otlp_endpoint=endpoint, stats=stats) as url,
    ):
        yield url


def server_for(
    role: str, isolate: bool, stats: ChildStats | None = None, received: ChildStats | None = None
) -> Serve:
    if role == "direct":
        return direct
    if role == TRACED:

        def traced(upstream: str) -> AbstractAsyncContextManager[str]:
            return traced_gateway(
                upstream, {} if stats is None else stats, {} if received is None else received
            )

        return traced
    if not isolate and role not in CHILD_ONLY:
        return SERVERS[role]

    def isolated(upstream: str) -> AbstractAsyncContextManager[str]:
        return in_child(role, upstream, stats=stats)

    return isolated


# -- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    tool: str
    share: float = 1.0


SCENARIOS = (
    Scenario("direct", "echo"),
    Scenario(RELAY, "echo"),
    Scenario("agent-gateway", "up__echo"),
    Scenario(UNAUDITED, "up__echo"),
    Scenario("fastmcp-proxy (reused)", "echo"),
    Scenario(REUSED_TUNED, "echo"),
    Scenario("fastmcp-proxy (default)", "echo", share=SLOW_SHARE),
)
TRACING_SCENARIOS = (Scenario(ISOLATED, "up__echo"), Scenario(TRACED, "up__echo"))
"""With ``--traced``: both always isolated, both up at once, measured shape by shape, compared."""


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
    traced: bool = False


@dataclass
class Served:
    """What a server child under test reported: its CPU time and the ``tools/call`` it answered."""

    scenario: str
    calls: int
    """``tools/call`` answered, warm-ups included (sessions' initialize and tools/list are not)."""
    stats: ChildStats
    received: ChildStats
    """The OTLP receiver's report (traced gateway only)."""

    @property
    def cpu_ms_per_call(self) -> float:
        return self.stats.get("cpu_s", 0.0) * 1e3 / self.calls if self.calls else 0.0


async def measure(scenario: Scenario, upstream: str, options: Options) -> tuple[list[Result], Served]:
    calls = max(1, round(options.calls * scenario.share))
    per_caller = max(1, round(options.per_caller * scenario.share))
    served = Served(scenario.name, 0, {}, {})
    async with server_for(scenario.name, options.isolate, served.stats, served.received)(upstream) as url:
        with anyio.fail_after(MEASURE_BOUND):
            seq = await sequential(url, scenario, calls, options.mode)
        with anyio.fail_after(MEASURE_BOUND):
            conc = await concurrent(url, scenario, options.concurrency, per_caller, options.mode)
    served.calls = calls_served(seq, conc, options)
    return [seq, conc], served


def calls_served(seq: Result, conc: Result, options: Options) -> int:
    return seq.calls + WARMUP_CALLS + conc.calls + 2 * options.concurrency


async def measure_tracing(upstream: str, options: Options) -> tuple[list[Result], list[Served]]:
    """The untraced and the traced gateway, both up at once, each shape measured on one and
    then the other back to back: a change in the machine's load (other tenants, a test run)
    then falls inside as few pairs as possible, and each ratio compares neighbours in time."""
    plain, traced = (Served(s.name, 0, {}, {}) for s in TRACING_SCENARIOS)
    plain_scenario, traced_scenario = TRACING_SCENARIOS
    async with (
        server_for(ISOLATED, options.isolate, plain.stats)(upstream) as plain_url,
        server_for(TRACED, options.isolate, traced.stats, traced.received)(upstream) as traced_url,
    ):
        pairs = ((plain_scenario, plain_url), (traced_scenario, traced_url))
        seq: list[Result] = []
        for scenario, url in pairs:
            print(f"measuring {scenario.name}, sequential ...", file=sys.stderr, flush=True)
            with anyio.fail_after(MEASURE_BOUND):
                seq.append(await sequential(url, scenario, options.calls, options.mode))
        conc: list[Result] = []
        for scenario, url in pairs:
            print(f"measuring {scenario.name}, concurrent ...", file=sys.stderr, flush=True)
            with anyio.fail_after(MEASURE_BOUND):
                conc.append(
                    await concurrent(url, scenario, options.concurrency, options.per_caller, options.mode)
                )
    for report, one, many in zip((plain, traced), seq, conc, strict=True):
        report.calls = calls_served(one, many, options)
    return [seq[0], conc[0], seq[1], conc[1]], [plain, traced]


async def run(options: Options) -> tuple[list[Result], list[Served]]:
    results: list[Result] = []
    served: list[Served] = []
    async with server_for("upstream", options.isolate)("") as upstream:
        for scenario in SCENARIOS:
            print(f"measuring {scenario.name} ...", file=sys.stderr, flush=True)
            measured, report = await measure(scenario, upstream, options)
            results += measured
            if report.stats:
                served.append(report)
        if options.traced:
            measured, reports = await measure_tracing(upstream, options)
            results += measured
            served += reports
    return results, served


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


def verdicts(results: list[Result], concurrency: int, served: list[Served]) -> str:
    """Issue 18's targets, and the same figures over the relay: the floor of any hop here."""

    def pick(scenario: str, shape: str) -> Result:
        return next(r for r in results if r.scenario == scenario and r.shape == shape)

    def p50(scenario: str) -> float:
        return pick(scenario, "sequential").percentile(50)

    many = f"{concurrency} concurrent"
    gateway, straight, reused, floor = (
        pick(s, many) for s in ("agent-gateway", "direct", "fastmcp-proxy (reused)", RELAY)
    )
    share = gateway.throughput / straight.throughput
    speedup = gateway.throughput / reused.throughput
    added = p50("agent-gateway") - p50("direct")
    cpu = next((s.cpu_ms_per_call for s in served if s.scenario == "agent-gateway"), None)
    cpu_row = (
        f"| agent-gateway CPU per tools/call | {cpu:.2f} ms | <= 0.8 ms | {_yes(cpu <= 0.8)} |"
        if cpu is not None
        else "| agent-gateway CPU per tools/call | n/a (one loop) | <= 0.8 ms | |"
    )
    return "\n".join(
        [
            "| ratio | measured | target | met |",
            "|---|---:|---:|---|",
            f"| agent-gateway / direct throughput, {many} | {share:.0%} | >= 80% | {_yes(share >= 0.8)} |",
            f"| agent-gateway p50 - direct p50, sequential | {added:+.2f} ms | <= 1 ms | {_yes(added <= 1)} |",
            cpu_row,
            f"| agent-gateway / fastmcp-proxy (reused) throughput, {many} "
            f"| {speedup:.2f}x | >= 1.5x | {_yes(speedup >= 1.5)} |",
            f"| ({RELAY} / direct throughput, {many}: the floor) | {floor.throughput / straight.throughput:.0%} | | |",
            f"| ({RELAY} p50 - direct p50, sequential: the floor) | {p50(RELAY) - p50('direct'):+.2f} ms | | |",
            f"| (agent-gateway / {RELAY} throughput, {many}) | {gateway.throughput / floor.throughput:.0%} | | |",
            f"| (agent-gateway p50 - {RELAY} p50, sequential) | {p50('agent-gateway') - p50(RELAY):+.2f} ms | | |",
            f"| (agent-gateway / {REUSED_TUNED} throughput, {many}) "
            f"| {gateway.throughput / pick(REUSED_TUNED, many).throughput:.2f}x | | |",
        ]
    )


def cpu_table(served: list[Served]) -> str:
    """Each server process's CPU per ``tools/call`` it answered (both shapes and warm-ups)."""
    lines = ["| server process | tools/call served | CPU ms per tools/call |", "|---|---:|---:|"]
    lines += [f"| {s.scenario} | {s.calls} | {s.cpu_ms_per_call:.2f} |" for s in served]
    return "\n".join(lines)


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def tracing_summary(results: list[Result], served: list[Served], concurrency: int) -> str:
    """Tracing's cost: the traced gateway over the untraced one, both isolated, in this run."""

    def pick(scenario: str, shape: str) -> Result:
        return next(r for r in results if r.scenario == scenario and r.shape == shape)

    shapes = ("sequential", f"{concurrency} concurrent")
    rows = [
        f"| traced / isolated (untraced) | {shapes[0]} | {shapes[1]} |",
        "|---|---:|---:|",
        "| p50 latency | "
        + " | ".join(
            f"{pick(TRACED, s).percentile(50) / pick(ISOLATED, s).percentile(50):.2f}x" for s in shapes
        )
        + " |",
        "| p99 latency | "
        + " | ".join(
            f"{pick(TRACED, s).percentile(99) / pick(ISOLATED, s).percentile(99):.2f}x" for s in shapes
        )
        + " |",
        "| throughput | "
        + " | ".join(f"{pick(TRACED, s).throughput / pick(ISOLATED, s).throughput:.2f}x" for s in shapes)
        + " |",
    ]
    by_role = {s.scenario: s for s in served}
    lines = ["\n".join(rows)]
    if ISOLATED in by_role and TRACED in by_role:
        plain, traced = by_role[ISOLATED], by_role[TRACED]
        received = traced.received
        spans = int(received.get("spans", 0))
        names = sorted(
            ((k.removeprefix(SPAN_PREFIX), int(v)) for k, v in received.items() if k.startswith(SPAN_PREFIX)),
            key=lambda item: -item[1],
        )
        lines += [
            "",
            "| server process | tools/call served | CPU s | CPU ms per tools/call |",
            "|---|---:|---:|---:|",
            *(
                f"| {s.scenario} | {s.calls} | {s.stats.get('cpu_s', 0.0):.2f} | {s.cpu_ms_per_call:.2f} |"
                for s in (plain, traced)
            ),
            f"| {RECEIVER} (for the traced gateway) | | {received.get('cpu_s', 0.0):.2f} | "
            f"{received.get('cpu_s', 0.0) * 1e3 / traced.calls:.2f} |",
            "",
            f"gateway CPU per tools/call, traced / untraced: {traced.cpu_ms_per_call / plain.cpu_ms_per_call:.2f}x",
            f"spans received: {spans} ({spans / traced.calls:.2f} per tools/call) in "
            f"{int(received.get('trace_requests', 0))} trace export requests; "
            f"{int(received.get('metric_requests', 0))} metric export requests; "
            f"{int(received.get('rejected', 0))} rejected",
            "spans by name: " + ", ".join(f"{name} {n}" for name, n in names),
            "CPU s of the traced gateway's other threads (before its final flush): "
            + ", ".join(
                f"{key.removeprefix(THREAD_PREFIX)} {value:.2f}"
                for key, value in sorted(traced.stats.items())
                if key.startswith(THREAD_PREFIX)
            ),
        ]
    return "\n".join(lines)


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
    parser.add_argument(
        "--one-loop",
        action="store_true",
        help="serve everything in this process's one event loop (compares CPU per call) instead of "
        "each server in a process of its own, as deployed (the default)",
    )
    parser.add_argument(
        "--traced",
        action="store_true",
        help="also measure the gateway isolated, untraced and traced (OTLP to a local receiver), and compare",
    )
    args = parser.parse_args(argv)
    return Options(args.calls, args.concurrency, args.per_caller, args.mode, not args.one_loop, args.traced)


def main() -> None:
    options = parse_args()
    quiet_logging()
    results, served = anyio.run(run, options)
    print(table(results))
    print()
    print(verdicts(results, options.concurrency, served))
    print()
    if served and not options.traced:
        print(cpu_table(served))
        print()
    if options.traced:
        print(tracing_summary(results, served, options.concurrency))
        print()
    print(f"command: `{shlex.join(sys.orig_argv)}`")
    layout = "each server in its own process" if options.isolate else "all servers in one event loop"
    print(f"layout: {layout}; warm-up {WARMUP_CALLS} calls per sequential session, 2 per concurrent one")
    if options.traced:
        print(
            f"{ISOLATED} and {TRACED}: each in its own process whatever the layout; the traced one "
            "samples every trace and exports spans (BatchSpanProcessor) and metrics over OTLP/HTTP "
            f"to {RECEIVER}, a third process"
        )


if __name__ == "__main__":
    main()
