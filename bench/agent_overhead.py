"""What ``ask_agent`` adds per agent step, and 50 concurrent runs without cross-talk.

The gateway runs with a scripted, instant LangChain chat model (``tests/agent/scripted.py``) in
place of a real one, so everything measured is the gateway's own: LangGraph, the checkpointer,
LangChain's model plumbing, the tool calls through the proxy, the MCP server and client stacks.
One inline FastMCP upstream ``math`` (tool ``add(a, b)``) is served over Streamable HTTP on
loopback; upstream, gateway and benchmark clients share this process's event loop.

1. **Per-step overhead** (one client session): for each N in ``--steps``, a run asks
   ``"add A and B, N times"``; the model calls ``math__add`` once per turn (N turns, each adding
   B to the last result) and then answers with the total, so the run has N + 1 model turns
   (``steps`` in the record). In the same repetition the client also makes the same N
   ``tools/call math__add`` calls straight through the gateway, one after another. Per run:

       overhead per step = (client wall - sum of the record's tool duration_ms - rt) / steps

   where ``rt`` is the p50 of the direct ``tools/call`` round trips measured in the same run
   (the cost of the one ``tools/call ask_agent`` that carries the run). ``--runs`` repetitions
   give p50/p95; each run uses a fresh conversation (``--thread fresh``) unless
   ``--thread session``, which keeps one conversation per session growing across runs.
2. **Concurrency**: ``--sessions`` client sessions, all connected first, then released together;
   session i asks ``"add A_i and B_i"`` (distinct numbers). The model is a stateless function of
   the messages it is sent. Every answer must be that session's own sum, every record's one tool
   call that session's own arguments, every thread_id distinct, the upstream must have run each
   pair exactly once, and the gateway's ``status()`` must show ``pending_calls == 0`` afterwards.

Both are measured with conversation memory in memory and in SQLite (a temporary file), unless
``--store`` picks one. Run from the repository root::

    .venv/bin/python bench/agent_overhead.py [--steps 1,5,10] [--runs 30] [--sessions 50] \
        [--store both|memory|sqlite] [--thread fresh|session] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import math
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from fastmcp import FastMCP
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `tests` importable
from bench.overhead import Starter
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.support import RunningGateway, running_gateway, serving_upstream

UPSTREAM = "math"
ADD = f"{UPSTREAM}__add"
AGENT = "ask_agent"
STORES = ("memory", "sqlite")
CALL_TIMEOUT = 60.0
PHASE_BOUND = 300.0
"""Seconds one measurement (one store, one part) may take, warm-up included."""
SETTLE_BOUND = 10.0
"""Seconds the gateway gets, after the last client has gone, to show no pending calls."""
WARMUP_RUNS = 3
"""Agent runs (and direct call series) per N before measuring, not counted."""
TARGET_MS = 5.0
QUIET = ("uvicorn", "uvicorn.error", "uvicorn.access", "fastmcp", "mcp", "httpx", "agent_gateway")
QUERY = re.compile(r"add (-?\d+) and (-?\d+)(?:, (\d+) times)?")


# -- the upstream and the model ---------------------------------------------------------------


@dataclass
class Ledger:
    """Every ``add`` the upstream ran, as (a, b)."""

    ran: list[tuple[int, int]] = field(default_factory=list)


def math_upstream(ledger: Ledger) -> FastMCP:
    server = FastMCP(UPSTREAM)

    @server.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ledger.ran.append((a, b))
        return a + b

    return server


def respond(messages: list[BaseMessage]) -> AIMessage:
    """A stateless model: everything it decides comes from the messages of this one call.

    The latest user message says ``add A and B[, N times]``; the tool results after it say how
    far the run has got. Until N results are in, call ``add(last result or A, B)``; then answer
    with the last result.
    """
    last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    found = QUERY.search(messages[last_human].text)
    if found is None:
        return answer(f"cannot parse {messages[last_human].text!r}")
    a, b, times = int(found[1]), int(found[2]), int(found[3] or 1)
    results = [m for m in messages[last_human + 1 :] if isinstance(m, ToolMessage)]
    if results and results[-1].status == "error":
        return answer(f"the tool failed: {results[-1].text}")
    if len(results) < times:
        return calls(call(ADD, a=int(results[-1].text) if results else a, b=b))
    return answer(results[-1].text)


def query(a: int, b: int, times: int = 1) -> str:
    return f"add {a} and {b}" if times == 1 else f"add {a} and {b}, {times} times"


# -- plumbing -------------------------------------------------------------------------------------


@asynccontextmanager
async def gateway(upstream: str, store: str, max_steps: int) -> AsyncIterator[RunningGateway]:
    async with gateway_and_file(upstream, store, max_steps) as (gw, _):
        yield gw


@asynccontextmanager
async def gateway_and_file(
    upstream: str, store: str, max_steps: int
) -> AsyncIterator[tuple[RunningGateway, Path | None]]:
    """A gateway over ``upstream`` with the scripted model, and its SQLite file (in a temporary
    directory, removed afterwards) when ``store`` is ``sqlite``."""
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        file = Path(tmp) / "conversations.sqlite" if store == "sqlite" else None
        memory = {"store": store} if file is None else {"store": store, "path": str(file)}
        config = {
            "upstreams": {UPSTREAM: {"url": upstream}},
            "agent": {"memory": memory, "max_steps": max_steps},
        }
        async with running_gateway(config, chat_model=scripted_model()) as gw:
            yield gw, file


def mib_on_disk(file: Path) -> float:
    """The SQLite file and its write-ahead log, in MiB."""
    parts = (file, file.with_name(file.name + "-wal"))
    return sum(part.stat().st_size for part in parts if part.exists()) / 2**20


def scripted_model() -> ScriptedChatModel:
    """The scripted model answering with ``respond``, keeping none of what it was sent."""
    model = ScriptedChatModel()

    def forgetful(messages: list[BaseMessage]) -> AIMessage:
        model.seen.clear()  # the test model keeps every call's messages; a long bench must not
        return respond(messages)

    model.respond = forgetful
    return model


def new_client(url: str, mode: str) -> Client:
    return Client(url, mode=mode, read_timeout_seconds=CALL_TIMEOUT)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0] if result.content else None
    return block.text if isinstance(block, types.TextContent) else ""


async def ask(client: Client, question: str, thread: str | None) -> tuple[float, dict[str, Any]]:
    """One ``ask_agent`` run: the client's wall time in seconds and the run's record."""
    arguments = {"query": question} if thread is None else {"query": question, "conversation_id": thread}
    started = time.perf_counter()
    result = await client.call_tool(AGENT, arguments)
    elapsed = time.perf_counter() - started
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{AGENT} failed: {text_of(result)}")
    return elapsed, result.structured_content


async def add_directly(client: Client, a: int, b: int) -> float:
    started = time.perf_counter()
    result = await client.call_tool(ADD, {"a": a, "b": b})
    elapsed = time.perf_counter() - started
    if result.is_error or text_of(result) != str(a + b):
        raise RuntimeError(f"{ADD}: unexpected result {result!r}")
    return elapsed


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


# -- part 1: overhead per step ----------------------------------------------------------------------


@dataclass
class AgentRun:
    wall: float
    tool: float
    steps: int
    direct: float
    """Wall time of the same N calls made by the client straight through the gateway."""


@dataclass
class StepRow:
    store: str
    n: int
    runs: list[AgentRun] = field(default_factory=list)
    rt: float = 0.0
    """p50 of the direct tools/call round trips of this store's session, in seconds."""

    def overheads(self) -> list[float]:
        return [(r.wall - r.tool - self.rt) / r.steps for r in self.runs]


async def direct_series(client: Client, a: int, b: int, n: int, latencies: list[float]) -> float:
    started = time.perf_counter()
    total = a
    for _ in range(n):
        latencies.append(await add_directly(client, total, b))
        total += b
    return time.perf_counter() - started


async def agent_run(client: Client, a: int, b: int, n: int, thread_mode: str) -> tuple[float, dict[str, Any]]:
    thread = f"bench-{uuid.uuid4().hex}" if thread_mode == "fresh" else None
    wall, record = await ask(client, query(a, b, n), thread)
    if record["answer"] != str(a + b * n) or record["steps"] != n + 1 or len(record["tool_calls"]) != n:
        raise RuntimeError(f"wrong run for {query(a, b, n)!r}: {record}")
    return wall, record


async def measure_steps(upstream: str, store: str, options: Options) -> tuple[list[StepRow], float | None]:
    """The rows for ``store``, and its SQLite file's size in MiB afterwards (None: in memory)."""
    rows = {n: StepRow(store, n) for n in options.steps}
    latencies: list[float] = []
    async with gateway_and_file(upstream, store, max(options.steps) + 1) as (gw, file):
        async with new_client(gw.url, options.mode) as client:
            await client.list_tools()
            for n in options.steps:
                for i in range(WARMUP_RUNS):
                    await direct_series(client, i, 3, n, [])
                    await agent_run(client, i, 3, n, options.thread)
            for rep in range(options.runs):
                for n in options.steps:
                    a, b = 1000 * rep + n, rep + 2
                    if rep % 2:  # alternate which goes first, so neither always runs on a warmer path
                        wall, record = await agent_run(client, a, b, n, options.thread)
                        direct = await direct_series(client, a, b, n, latencies)
                    else:
                        direct = await direct_series(client, a, b, n, latencies)
                        wall, record = await agent_run(client, a, b, n, options.thread)
                    tool = sum(c["duration_ms"] for c in record["tool_calls"]) / 1e3
                    rows[n].runs.append(AgentRun(wall, tool, record["steps"], direct))
        size = None if file is None else mib_on_disk(file)
    rt = percentile(latencies, 50)
    for row in rows.values():
        row.rt = rt
    return list(rows.values()), size


# -- part 2: concurrent sessions ----------------------------------------------------------------------


@dataclass
class ConcurrentRow:
    store: str
    sessions: int
    wall: float = 0.0
    """From the release to the last answer (sessions closing afterwards not included)."""
    latencies: list[float] = field(default_factory=list)
    gateway_times: list[float] = field(default_factory=list)
    """Each run's ``ended_at - started_at`` from its record (millisecond stamps)."""
    finished: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pending_after: int | None = None


def numbers(index: int) -> tuple[int, int]:
    """Session ``index``'s pair: every pair and every sum differs from every other session's."""
    return 17 + index, 25 + 3 * index


async def one_session(
    url: str,
    mode: str,
    index: int,
    starter: Starter,
    sample: dict[str, Any],
    records: dict[int, dict[str, Any]],
    row: ConcurrentRow,
) -> None:
    a, b = numbers(index)
    async with new_client(url, mode) as client:
        # Warm the session as a long-lived client would be: the tool list fetched and the client's
        # validator for ask_agent's output schema compiled (~10 ms of jsonschema per session, which
        # the mcp client would otherwise spend inside the measured window, on this same event loop).
        await client.list_tools()
        await client.session.validate_tool_result(
            AGENT, types.CallToolResult(content=[], structured_content=sample)
        )
        await starter.arrive()
        wall, record = await ask(client, query(a, b), None)  # default thread: the session's own
        row.finished.append(time.perf_counter())
    row.latencies.append(wall)
    row.gateway_times.append(run_seconds(record))
    records[index] = record


def run_seconds(record: dict[str, Any]) -> float:
    started = datetime.fromisoformat(record["started_at"])
    return (datetime.fromisoformat(record["ended_at"]) - started).total_seconds()


def check_concurrent(
    row: ConcurrentRow, records: dict[int, dict[str, Any]], ran: list[tuple[int, int]]
) -> None:
    problems = row.problems
    for index in range(row.sessions):
        a, b = numbers(index)
        record = records.get(index)
        if record is None:
            problems.append(f"session {index}: no answer")
            continue
        if record["answer"] != str(a + b):
            problems.append(f"session {index}: answer {record['answer']!r}, expected {a + b}")
        made = [(c["name"], c["arguments"], c["is_error"]) for c in record["tool_calls"]]
        if made != [(ADD, {"a": a, "b": b}, False)]:
            problems.append(f"session {index}: tool calls {made}")
    threads = Counter(r["thread_id"] for r in records.values())
    if shared := [t for t, count in threads.items() if count > 1]:
        problems.append(f"{len(shared)} thread_id(s) shared between sessions")
    runs = Counter(r["run_id"] for r in records.values())
    if len(runs) != len(records):
        problems.append("run_ids not distinct")
    expected = Counter(numbers(i) for i in range(row.sessions))
    if Counter(ran) != expected:
        problems.append(
            f"upstream ran {sorted(Counter(ran) - expected)} extra, {sorted(expected - Counter(ran))} missing"
        )


async def measure_concurrent(upstream: str, ledger: Ledger, store: str, options: Options) -> ConcurrentRow:
    row = ConcurrentRow(store, options.sessions)
    records: dict[int, dict[str, Any]] = {}
    async with gateway(upstream, store, 10) as gw:
        async with new_client(gw.url, options.mode) as warm:  # builds the graph, opens the store
            _, sample = await ask(warm, query(1, 1), None)
        ledger.ran.clear()
        starter = Starter(options.sessions)
        async with anyio.create_task_group() as tg:
            for index in range(options.sessions):
                tg.start_soon(one_session, gw.url, options.mode, index, starter, sample, records, row)
            await starter.release()
        row.wall = max(row.finished, default=starter.started) - starter.started
        check_concurrent(row, records, list(ledger.ran))
        with anyio.move_on_after(SETTLE_BOUND):
            while gw.gateway.status()["pending_calls"] != 0:
                await anyio.sleep(0.01)
        pending = gw.gateway.status()["pending_calls"]
        row.pending_after = pending if isinstance(pending, int) else None
        if row.pending_after != 0:
            row.problems.append(f"pending_calls after the runs: {pending}")
    return row


# -- running it -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    steps: tuple[int, ...]
    runs: int
    sessions: int
    stores: tuple[str, ...]
    thread: str
    mode: str
    profile: str | None


@dataclass
class Results:
    steps: list[StepRow] = field(default_factory=list)
    concurrent: list[ConcurrentRow] = field(default_factory=list)
    sqlite_mib: float | None = None
    """The SQLite store's file after the per-step runs (all on one session)."""


async def run(options: Options) -> Results:
    ledger = Ledger()
    results = Results()
    async with serving_upstream(math_upstream(ledger)) as upstream:
        for store in options.stores:
            if options.runs:
                progress(f"per-step overhead, {store} store ...")
                with anyio.fail_after(PHASE_BOUND):
                    rows, size = await measure_steps(upstream, store, options)
                results.steps += rows
                results.sqlite_mib = size if size is not None else results.sqlite_mib
            if options.sessions:
                progress(f"{options.sessions} concurrent sessions, {store} store ...")
                with anyio.fail_after(PHASE_BOUND):
                    results.concurrent.append(await measure_concurrent(upstream, ledger, store, options))
    return results


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- reporting --------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def steps_table(rows: list[StepRow]) -> str:
    lines = [
        "| store | N tool calls | model turns (steps) | runs | agent wall p50 / p95 ms "
        "| Σ tool duration_ms p50 | rt ms | overhead/step p50 / p95 ms | direct N calls p50 ms "
        "| agent/direct p50 | < 5 ms/step (p50) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        walls = [r.wall for r in row.runs]
        over = row.overheads()
        ratios = [r.wall / r.direct for r in row.runs]
        met = percentile(over, 50) * 1e3 < TARGET_MS
        lines.append(
            f"| {row.store} | {row.n} | {row.runs[0].steps} | {len(row.runs)} "
            f"| {ms(percentile(walls, 50))} / {ms(percentile(walls, 95))} "
            f"| {ms(percentile([r.tool for r in row.runs], 50))} | {ms(row.rt)} "
            f"| {ms(percentile(over, 50))} / {ms(percentile(over, 95))} "
            f"| {ms(percentile([r.direct for r in row.runs], 50))} "
            f"| {percentile(ratios, 50):.2f}x | {'yes' if met else '**no**'} |"
        )
    return "\n".join(lines)


def marginal_table(rows: list[StepRow]) -> str:
    """The cost of one more tool step, from the smallest and largest N: fixed costs cancel out."""
    lines = [
        "| store | from N → N | extra per added step p50 ms (wall - tool time) | of which tool call ms |",
        "|---|---|---:|---:|",
    ]
    for store in dict.fromkeys(r.store for r in rows):
        mine = sorted((r for r in rows if r.store == store), key=lambda r: r.n)
        if len(mine) < 2:
            continue
        low, high = mine[0], mine[-1]
        added = high.n - low.n

        def extra(row: StepRow) -> float:
            return statistics.median(r.wall - r.tool for r in row.runs)

        def tool(row: StepRow) -> float:
            return statistics.median(r.tool for r in row.runs)

        lines.append(
            f"| {store} | {low.n} → {high.n} | {ms((extra(high) - extra(low)) / added)} "
            f"| {ms((tool(high) - tool(low)) / added)} |"
        )
    return "\n".join(lines)


def concurrent_table(rows: list[ConcurrentRow]) -> str:
    lines = [
        "| store | sessions | answered | wall s | runs/s | client per run p50 / p95 ms "
        "| gateway per run p50 / p95 ms | pending_calls after | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def spread(values: list[float]) -> str:
        return f"{ms(percentile(values, 50))} / {ms(percentile(values, 95))}" if values else "n/a"

    for row in rows:
        answered = len(row.latencies)
        rate = answered / row.wall if row.wall else 0.0
        lines.append(
            f"| {row.store} | {row.sessions} | {answered} | {row.wall:.2f} | {rate:.0f} "
            f"| {spread(row.latencies)} | {spread(row.gateway_times)} "
            f"| {row.pending_after} | {'pass' if not row.problems else '**FAIL**'} |"
        )
    return "\n".join(lines)


# -- entry point --------------------------------------------------------------------------------------


def quiet_logging() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--steps", default="1,5,10", help="tool calls per agent run, comma-separated (default 1,5,10)"
    )
    parser.add_argument(
        "--runs", type=int, default=30, help="measured runs per N and store (default 30; 0 skips)"
    )
    parser.add_argument(
        "--sessions", type=int, default=50, help="concurrent sessions, one run each (default 50; 0 skips)"
    )
    parser.add_argument("--store", choices=("both", *STORES), default="both", help="conversation memory")
    parser.add_argument(
        "--thread",
        choices=("fresh", "session"),
        default="fresh",
        help="per-step runs: a fresh conversation per run (default) or one per session, growing",
    )
    parser.add_argument("--mode", default="legacy", help="the clients' connect mode (default legacy)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the whole run to FILE")
    args = parser.parse_args(argv)
    steps = tuple(sorted({int(s) for s in args.steps.split(",") if s.strip()}))
    if not steps or min(steps) < 1 or max(steps) > 99:
        parser.error("--steps: between 1 and 99 tool calls per run")
    stores = STORES if args.store == "both" else (args.store,)
    return Options(steps, args.runs, args.sessions, stores, args.thread, args.mode, args.profile)


def main() -> None:
    options = parse_args()
    quiet_logging()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if options.profile:
        profiler = cProfile.Profile()
        results: Results = profiler.runcall(anyio.run, run, options)
        profiler.dump_stats(options.profile)
    else:
        results = anyio.run(run, options)
    if results.steps:
        print(steps_table(results.steps))
        print()
        if len(options.steps) > 1:
            print(marginal_table(results.steps))
            print()
        if results.sqlite_mib is not None:
            runs = (WARMUP_RUNS + options.runs) * len(options.steps)
            threads = "one thread" if options.thread == "session" else f"{runs} threads"
            print(
                f"SQLite file after the per-step runs: {results.sqlite_mib:.1f} MiB ({runs} runs on {threads})"
            )
            print()
    if results.concurrent:
        print(concurrent_table(results.concurrent))
        print()
    print(f"command: `{shlex.join(sys.orig_argv)}` (1/5/15-min load average before the run: {load})")
    print(
        f"overhead/step = (agent wall - Σ tool duration_ms - rt) / steps; rt = p50 of the direct "
        f"{ADD} round trips in the same run; steps = model turns = N + 1; threads: {options.thread}; "
        f"clients mode={options.mode}; upstream, gateway and clients share one event loop"
    )
    problems = [f"{row.store}: {p}" for row in results.concurrent for p in row.problems]
    for problem in problems:
        print(f"- {problem}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
