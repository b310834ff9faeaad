"""Cancel storm: open many calls through agent-gateway, cancel each mid-flight, count what is left.

The recording upstream (``tests/servers/recorder.py``, tool ``wait``) is reached over stdio and/or
Streamable HTTP, in the handshake era (``protocol: legacy``), where a cancel reaches the upstream
as ``notifications/cancelled``. (A modern-era HTTP upstream is cancelled by closing the request's
stream instead, so it receives no notification to count.)

Layouts: ``split`` (default) runs ``agent-gateway serve`` in a process of its own and the HTTP
recorder in another, so the clients' load is not the gateway's; ``inline`` runs the gateway,
the HTTP recorder and the clients in this process and event loop.

``--concurrency`` workers, each with its own ``mcp.Client`` session (``mode="legacy"``), share
``--calls`` calls of ``rec__wait {"seconds": 60}``. A worker starts a call, waits until the
upstream has recorded that call as started (the recorder's ``started`` event carries the
worker's gateway session id in ``_meta``, so each start is matched to its call), then cancels
the call and starts the next one. Afterwards the script waits (bounded) for the upstream to
settle and reports: calls started upstream, ``notifications/cancelled`` received upstream, how
many of those name a started upstream request id, ids it does not know, handlers cancelled,
the gateway's pending calls, asyncio tasks and RSS before and after, and the latency from the
client's cancel to the upstream's receipt (the recorder stamps its events with
``time.perf_counter()``, CLOCK_MONOTONIC, which every process on the machine shares).

Run from the repository root::

    .venv/bin/python bench/cancel_storm.py [--calls 1000] [--concurrency 50] \
        [--upstream stdio|http|both] [--layout split|inline]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import Process
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `tests` importable
from tests.servers import recorder
from tests.support import RunningGateway, gateway_env, python_upstream, running_gateway, serving_upstream

RECORDER = Path(__file__).resolve().parent.parent / "tests" / "servers" / "recorder.py"
GATEWAY = Path(sys.executable).parent / "agent-gateway"
STARTUP_BOUND = 30.0
"""Seconds the gateway (and its upstream) may take to start."""
STORM_BOUND = 30.0
STORM_BOUND_PER_CALL = 0.1
"""One storm (all calls to one upstream kind) may take STORM_BOUND + this many seconds per call."""
START_BOUND = 15.0
"""Seconds one call may take to be recorded as started upstream."""
SETTLE_BOUND = 10.0
"""Seconds the upstream and the gateway get, after the last cancel, to settle."""
CALL_TIMEOUT = 120.0
WAIT_SECONDS = 60.0
"""How long each ``rec__wait`` call would run if it were not cancelled."""
POLL = 0.005
"""Seconds between reads of a stdio recorder's log file."""
TOOL = "rec__wait"
SESSION_KEY = "io.agent-gateway/session-id"
"""The ``_meta`` key in which the gateway tells the upstream the downstream session id."""
CANCELLED = "notifications/cancelled"
QUIET = ("uvicorn", "uvicorn.error", "uvicorn.access", "fastmcp", "mcp", "httpx", "agent_gateway")
SILENT = ("mcp.client.streamable_http",)
"""Loggers muted entirely: the client logs an SSE event that lands after its call was cancelled
(and its stream closed) as an error with a traceback; for this script that is expected."""


# -- what the upstream saw ---------------------------------------------------------------------


@dataclass
class Watch:
    """The recorder's events as they arrive, each with the ``perf_counter`` time it was seen."""

    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    started: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    """``started`` events by the gateway session id in their ``_meta``."""
    _wake: dict[str, anyio.Event] = field(default_factory=dict)

    def add(self, event: dict[str, Any]) -> None:
        # A recorder in another process stamps its events (same CLOCK_MONOTONIC as ours).
        self.events.append((float(event.get("at", time.perf_counter())), event))
        if event.get("event") == "started":
            meta = event.get("meta") or {}
            sid = str(meta.get(SESSION_KEY))
            self.started[sid].append(event)
            self.poke(sid)

    def poke(self, sid: str) -> None:
        """Wake whoever waits for a start on session ``sid``."""
        if (wake := self._wake.pop(sid, None)) is not None:
            wake.set()

    async def nth_start(self, sid: str, n: int, finished: Callable[[], bool]) -> dict[str, Any] | None:
        """The ``n``-th ``started`` event of session ``sid``; None if the call finished first."""
        while len(self.started[sid]) <= n:
            if finished():
                return None
            await self._wake.setdefault(sid, anyio.Event()).wait()
        return self.started[sid][n]

    def since(self, skip: int) -> Watch:
        """The events after the first ``skip`` (a copy, for counting only)."""
        return Watch(self.events[skip:])

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e.get("event") == kind]

    def cancels(self) -> list[tuple[float, str]]:
        """Each ``notifications/cancelled`` received upstream: when it was seen, its request id."""
        return [
            (at, str((e.get("params") or {}).get("requestId")))
            for at, e in self.events
            if e.get("event") == "notification" and e.get("method") == CANCELLED
        ]


def read_from(path: Path, offset: int) -> bytes:
    """What ``path`` holds past ``offset`` (nothing if it does not exist yet)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


async def tail(path: Path, watch: Watch) -> None:
    """Feed ``watch`` the JSON lines a stdio recorder appends to ``path``, until cancelled."""
    offset = 0
    pending = b""
    while True:
        chunk = read_from(path, offset)  # a small local read: not worth a thread per poll
        if chunk:
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    watch.add(json.loads(line))
        await anyio.sleep(POLL)


@dataclass(frozen=True)
class Target:
    """The gateway under test, wherever it runs: its MCP URL, its /status, its RSS."""

    url: str
    status: Callable[[], Awaitable[dict[str, Any]]]
    rss: Callable[[], float]
    cpu: Callable[[], float]
    """CPU seconds (user + system) the gateway's process has used so far."""


@asynccontextmanager
async def inline_gateway(kind: str) -> AsyncIterator[tuple[Target, Watch]]:
    """The gateway (and an HTTP recorder) in this process and event loop, next to the clients."""
    async with recorded_gateway(kind) as (gw, watch):

        async def status() -> dict[str, Any]:
            return gw.gateway.status()

        yield Target(gw.url, status, rss_mib, cpu_seconds), watch


@asynccontextmanager
async def split_gateway(kind: str) -> AsyncIterator[tuple[Target, Watch]]:
    """The gateway as ``agent-gateway serve`` in a process of its own, the HTTP recorder in another
    (a stdio recorder is the gateway's child): the clients' load is not the gateway's."""
    watch = Watch()
    with tempfile.TemporaryDirectory(prefix="cancel-storm-") as tmp:
        log = Path(tmp) / "recorder.jsonl"
        env = {"RECORDER_LOG": str(log)}
        async with AsyncExitStack() as stack:
            if kind == "http":
                port = free_port()
                recorder_cmd = [sys.executable, str(RECORDER), "--http", str(port)]
                await stack.enter_async_context(
                    child(recorder_cmd, {**os.environ, **env}, Path(tmp) / "recorder.stderr")
                )
                upstream: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/mcp", "protocol": "legacy"}
            else:
                upstream = python_upstream("recorder.py", env=env, protocol="legacy")
            gw_port = free_port()
            config = Path(tmp) / "gateway.yaml"  # JSON is YAML
            server = {"transport": "http", "port": gw_port}
            config.write_text(json.dumps({"server": server, "upstreams": {"rec": upstream}}))
            command = [str(GATEWAY), "--log-level", "warning", "serve", "-c", str(config)]
            gateway = await stack.enter_async_context(
                child(command, gateway_env(), Path(tmp) / "gateway.stderr")
            )
            http = await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw_port}"))
            await until_ready(http)

            async def status() -> dict[str, Any]:
                return (await http.get("/status")).json()

            async with anyio.create_task_group() as tg:
                tg.start_soon(tail, log, watch)
                url = f"http://127.0.0.1:{gw_port}/mcp"
                yield (
                    Target(url, status, lambda: rss_mib(gateway.pid), lambda: cpu_seconds(gateway.pid)),
                    watch,
                )
                tg.cancel_scope.cancel()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def child(command: list[str], env: dict[str, str], stderr: Path) -> AsyncIterator[Process]:
    """Run ``command`` (its stderr kept in ``stderr``); on exit SIGTERM it, wait (bounded), SIGKILL."""
    with stderr.open("wb") as errors:
        process = await anyio.open_process(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        try:
            yield process
        finally:
            with anyio.CancelScope(shield=True):
                process.terminate()
                with anyio.move_on_after(SETTLE_BOUND):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def until_ready(http: httpx.AsyncClient) -> None:
    """Wait until the gateway answers /readyz with every upstream up."""
    with anyio.fail_after(STARTUP_BOUND):
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            await anyio.sleep(0.1)


@asynccontextmanager
async def recorded_gateway(kind: str) -> AsyncIterator[tuple[RunningGateway, Watch]]:
    """A gateway in front of the recorder over ``kind`` (stdio or http), and what it records."""
    watch = Watch()
    if kind == "stdio":
        with tempfile.TemporaryDirectory(prefix="cancel-storm-") as tmp:
            log = Path(tmp) / "recorder.jsonl"
            upstream = python_upstream("recorder.py", env={"RECORDER_LOG": str(log)}, protocol="legacy")
            async with (
                running_gateway({"upstreams": {"rec": upstream}}, settle_timeout=STARTUP_BOUND) as gw,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(tail, log, watch)
                yield gw, watch
                tg.cancel_scope.cancel()
        return
    async with (
        serving_upstream(recorder.build(watch.add)) as url,
        running_gateway(
            {"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}, settle_timeout=STARTUP_BOUND
        ) as gw,
    ):
        yield gw, watch


# -- the storm ---------------------------------------------------------------------------------


@dataclass
class Storm:
    """Shared by the workers: the call budget and what the clients saw."""

    budget: int
    cancelled_at: dict[str, float] = field(default_factory=dict)
    """``perf_counter`` time of the client's cancel, by the upstream request id of the call."""
    finished_early: int = 0
    """Calls that returned (result or error) before they were seen started upstream."""
    errors: list[str] = field(default_factory=list)

    def take(self) -> bool:
        if self.budget <= 0:
            return False
        self.budget -= 1
        return True


def new_client(url: str) -> Client:
    return Client(url, mode="legacy", read_timeout_seconds=CALL_TIMEOUT)


async def own_session_id(client: Client) -> str:
    """The gateway's id for this client's session, as the upstream sees it in ``_meta``."""
    result = await client.call_tool("rec__whoami", {})
    data = result.structured_content or {}
    return str((data.get("meta") or {}).get(SESSION_KEY))


async def worker(url: str, watch: Watch, storm: Storm) -> None:
    """One client session: take calls from the budget, cancel each once it started upstream."""
    async with new_client(url) as client:
        sid = await own_session_id(client)
        n = 0
        while storm.take():
            if await call_and_cancel(client, sid, n, watch, storm):
                n += 1


async def call_and_cancel(client: Client, sid: str, n: int, watch: Watch, storm: Storm) -> bool:
    """Call ``wait``; cancel it once the upstream recorded it as session ``sid``'s ``n``-th start.

    Returns whether it was cancelled mid-flight (False: it returned before it started upstream).
    """
    finished = anyio.Event()

    async def call() -> None:
        try:
            await client.call_tool(TOOL, {"seconds": WAIT_SECONDS})
        except Exception as exc:  # counted and reported, not fatal
            storm.errors.append(f"{type(exc).__name__}: {exc}")
        finished.set()
        watch.poke(sid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.fail_after(START_BOUND):
            started = await watch.nth_start(sid, n, finished.is_set)
        if started is None:
            storm.finished_early += 1
            return False
        storm.cancelled_at[str(started["request_id"])] = time.perf_counter()
        tg.cancel_scope.cancel()
    return True


async def warm_up(url: str, watch: Watch) -> None:
    """One session, one call cancelled mid-flight: what the storm does, once, before measuring."""
    storm = Storm(1)
    await worker(url, watch, storm)
    with anyio.fail_after(SETTLE_BOUND):  # both: a stdio upstream logs its handler's end first
        while not (watch.of("handler_cancelled") and watch.cancels()):
            await anyio.sleep(0.01)


# -- measuring ---------------------------------------------------------------------------------


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds used by ``pid`` (default: this process), from /proc."""
    fields = Path(f"/proc/{pid or 'self'}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int | None = None) -> float:
    """The resident set size (``VmRSS``) of ``pid`` (default: this process), in MiB."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


@dataclass
class Row:
    upstream: str
    calls: int = 0
    cancelled: int = 0
    seconds: float = 0.0
    started: int = 0
    cancels: int = 0
    matching: int = 0
    unknown: int = 0
    duplicates: int = 0
    handler_cancelled: int = 0
    never_cancelled: int = 0
    settle: float = 0.0
    pending: object = None
    sessions_live: object = None
    tasks_before: int = 0
    tasks_after: int = 0
    cpu: float = 0.0
    """CPU seconds the gateway's process used during the storm."""
    rss_before: float = 0.0
    rss_after: float = 0.0
    latencies: list[float] = field(default_factory=list)
    finished_early: int = 0
    errors: list[str] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the cancel latencies, in milliseconds."""
        ordered = sorted(self.latencies)
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return ordered[rank - 1] * 1e3


async def settled(watch: Watch, target: Target, skip: int, expected: int) -> bool:
    """Whether every cancelled call's cancel and handler cancellation reached the upstream."""
    seen = watch.since(skip)
    return (
        len(seen.cancels()) >= expected
        and len(seen.of("handler_cancelled")) >= expected
        and (await target.status())["pending_calls"] == 0
    )


async def storm_through(kind: str, options: Options) -> Row:
    calls, concurrency = options.calls, options.concurrency
    row = Row(kind, calls=calls)
    gateway = split_gateway if options.layout == "split" else inline_gateway
    async with gateway(kind) as (gw, watch):
        await warm_up(gw.url, watch)
        skip_started = {str(e["request_id"]) for e in watch.of("started")}
        skip = len(watch.events)  # the warm-up's events are not the storm's
        gc.collect()
        row.tasks_before, row.rss_before = (await gw.status())["tasks"], gw.rss()

        storm = Storm(calls)
        began, cpu_began = time.perf_counter(), gw.cpu()
        with anyio.fail_after(STORM_BOUND + STORM_BOUND_PER_CALL * calls):
            async with anyio.create_task_group() as tg:
                for _ in range(min(concurrency, calls)):
                    tg.start_soon(worker, gw.url, watch, storm)
        row.seconds = time.perf_counter() - began
        row.cpu = gw.cpu() - cpu_began
        row.cancelled = len(storm.cancelled_at)

        quiet = time.perf_counter()
        with anyio.move_on_after(SETTLE_BOUND):
            while not await settled(watch, gw, skip, row.cancelled):
                await anyio.sleep(0.05)
        row.settle = time.perf_counter() - quiet

        status = await gw.status()
        gc.collect()
        row.tasks_after, row.rss_after = status["tasks"], gw.rss()
        row.pending = status["pending_calls"]
        sessions = status["sessions"]
        row.sessions_live = sessions.get("live") if isinstance(sessions, dict) else None

        events = watch.since(skip)
        started = {str(e["request_id"]) for e in events.of("started")} - skip_started
        cancels = events.cancels()
        ids = [rid for _, rid in cancels]
        row.started = len(started)
        row.cancels = len(cancels)
        row.matching = sum(rid in started for rid in ids)
        row.unknown = sum(rid not in started for rid in ids)
        row.duplicates = len(ids) - len(set(ids))
        row.handler_cancelled = len(events.of("handler_cancelled"))
        row.never_cancelled = len(started - set(ids))
        row.finished_early = storm.finished_early
        row.errors = storm.errors
        # Every event is on our clock (stamped by the recorder, CLOCK_MONOTONIC, or seen here).
        # Receipt: the first sign of the cancel upstream, the notification or the handler's end.
        first: dict[str, float] = {}
        ends = [
            (at, str(e.get("request_id"))) for at, e in events.events if e.get("event") == "handler_cancelled"
        ]
        for at, rid in sorted([*cancels, *ends]):
            first.setdefault(rid, at)
        row.latencies = [first[rid] - at for rid, at in storm.cancelled_at.items() if rid in first]
    return row


async def run(options: Options) -> list[Row]:
    kinds = ["stdio", "http"] if options.upstream == "both" else [options.upstream]
    rows: list[Row] = []
    for kind in kinds:
        print(f"storming {kind} upstream ...", file=sys.stderr, flush=True)
        rows.append(await storm_through(kind, options))
    return rows


# -- reporting ---------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| upstream | calls cancelled mid-flight | wall s | gateway CPU s | started upstream "
        "| notifications/cancelled upstream | matching ids | unknown ids | handlers cancelled "
        "| pending calls after | asyncio tasks before → after | RSS MiB before → after "
        "| cancel → upstream p50 / p95 / max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        latency = (
            f"{r.percentile(50):.1f} / {r.percentile(95):.1f} / {max(r.latencies) * 1e3:.1f}"
            if r.latencies
            else "n/a"
        )
        lines.append(
            f"| {r.upstream} (legacy) | {r.cancelled} / {r.calls} | {r.seconds:.1f} | {r.cpu:.1f} | {r.started} "
            f"| {r.cancels} | {r.matching} | {r.unknown} | {r.handler_cancelled} | {r.pending} "
            f"| {r.tasks_before} → {r.tasks_after} | {r.rss_before:.1f} → {r.rss_after:.1f} "
            f"({r.rss_after - r.rss_before:+.1f}) | {latency} |"
        )
    return "\n".join(lines)


def findings(rows: list[Row]) -> list[str]:
    """What in this run is not as it should be (empty when every call was cleanly cancelled)."""
    out: list[str] = []
    for r in rows:
        name = f"{r.upstream} upstream"
        if r.cancelled != r.calls:
            out.append(f"{name}: {r.calls - r.cancelled} of {r.calls} calls were not cancelled mid-flight")
        if r.finished_early:
            out.append(f"{name}: {r.finished_early} calls returned before the upstream started them")
        if r.errors:
            out.append(f"{name}: {len(r.errors)} client errors, first: {r.errors[0]}")
        if r.started != r.cancelled:
            out.append(f"{name}: {r.started} calls started upstream but {r.cancelled} cancelled by clients")
        if r.matching != r.started or r.cancels != r.started:
            out.append(
                f"{name}: {r.cancels} cancels upstream, {r.matching} matching, for {r.started} started"
            )
        if r.unknown:
            out.append(f"{name}: {r.unknown} cancels name an id the upstream never started")
        if r.duplicates:
            out.append(f"{name}: {r.duplicates} request ids cancelled more than once")
        if r.never_cancelled:
            out.append(f"{name}: {r.never_cancelled} started calls never got notifications/cancelled")
        if r.handler_cancelled != r.started:
            out.append(f"{name}: {r.handler_cancelled} handlers cancelled for {r.started} started")
        if r.pending != 0:
            out.append(f"{name}: the gateway still reports {r.pending} pending calls")
        if r.sessions_live != 0:
            out.append(f"{name}: {r.sessions_live} downstream sessions still live after all clients closed")
        if r.tasks_after != r.tasks_before:
            out.append(f"{name}: asyncio tasks {r.tasks_before} before, {r.tasks_after} after")
    return out


# -- entry point -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    calls: int
    concurrency: int
    upstream: str
    layout: str


def quiet_logging() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1000, help="calls to open and cancel (default 1000)")
    parser.add_argument(
        "--concurrency", type=int, default=50, help="client sessions calling at once (default 50)"
    )
    parser.add_argument(
        "--upstream",
        choices=("stdio", "http", "both"),
        default="both",
        help="the recorder upstream's transport; both (default) storms each once",
    )
    parser.add_argument(
        "--layout",
        choices=("split", "inline"),
        default="split",
        help="split (default): gateway and HTTP upstream in processes of their own; "
        "inline: everything in this process and event loop",
    )
    args = parser.parse_args(argv)
    if args.calls < 1 or args.concurrency < 1:
        parser.error("--calls and --concurrency must be at least 1")
    return Options(args.calls, args.concurrency, args.upstream, args.layout)


LAYOUTS = {
    "split": "`agent-gateway serve` in a process of its own (RSS and asyncio tasks are that process's, "
    "from /proc and /status; the stdio upstream is its child, not counted), the HTTP upstream in "
    "another, the clients in this one; before = after one warm-up call cancelled the same way, "
    "after = once the upstream settled and every client session closed",
    "inline": "gateway, clients and the HTTP upstream share this process and its event loop, so RSS "
    "and asyncio tasks are this whole process's (the stdio upstream is a child process, not counted), "
    "and after includes this script's own record of ~3 upstream events per call; before = after one "
    "warm-up call cancelled the same way, after = once the upstream settled and every client session closed",
}


def main() -> None:
    options = parse_args()
    quiet_logging()
    rows = anyio.run(run, options)
    print(table(rows))
    print()
    print(f"command: `{shlex.join(sys.orig_argv)}`")
    print(f"layout: {LAYOUTS[options.layout]}")
    print(
        f"each of {options.concurrency} client sessions (mcp.Client, mode=legacy) calls {TOOL} "
        f'{{"seconds": {WAIT_SECONDS:g}}} and cancels it once the upstream has recorded it started; '
        "upstreams use protocol: legacy, so a cancel arrives as notifications/cancelled "
        "(a modern-era HTTP upstream is cancelled by closing the request's stream instead)"
    )
    print(
        "cancel → upstream latency: from the client's cancel to the first sign of it upstream "
        "(its notifications/cancelled or its handler's cancellation), on one clock (CLOCK_MONOTONIC); "
        + (
            "n/a for the stdio upstream inline (its log is read by polling)"
            if options.layout == "inline"
            else ""
        )
    )
    problems = findings(rows)
    print("findings: " + ("none" if not problems else ""))
    for problem in problems:
        print(f"- {problem}")


if __name__ == "__main__":
    main()
