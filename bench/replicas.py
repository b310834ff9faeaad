"""What several replicas cost and what they buy: ``tools/call`` through one replica alone and
through two behind nginx sharing Redis, and how long a client waits after its replica dies.

Every gateway is an ``agent-gateway serve`` process (its own stdio upstream, the demo notes
server's ``word_count``); Redis and nginx are the real servers (``tests/replicas/services.py``).
Rows, each in the same run:

- ``1 replica``: no ``store:``, the client straight to the gateway (the baseline);
- ``1 replica + store``: the same with ``store:`` (Redis: limits, session records, the SSE
  event store): its difference from the baseline is the shared store's cost per call;
- ``1 replica + store, via nginx``: the balancer's own cost;
- ``2 replicas + store, via nginx``: round robin, every session adopted by both replicas.

Then ``failover``: clients calling back to back through nginx, one replica SIGKILLed; the
time from the kill to each client's next answered call, and the calls that failed.

On one 2-core machine two replicas cannot add throughput (they share the cores with nginx,
Redis and the load); the figures that matter are the store's cost per call and the failover.

Run from the repository root::

    .venv/bin/python bench/replicas.py [--calls 300] [--concurrency 16] [--mode legacy|auto]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import Redis, redis_server

TOOL = "notes__word_count"
WARMUP = 20
CALL_BOUND = 10.0
"""A call not answered within this has failed (a bench must end, whatever the replicas do)."""


@dataclass
class Row:
    name: str
    load: str
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def calls_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else 0.0


def gateway_config(redis: Redis | None, prefix: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "upstreams": {"notes": {"command": "python", "args": ["-m", "agent_gateway.demo_server"]}},
        "agent": {"enabled": False},
        "audit": {"enabled": False},
        "telemetry": {"metrics": False},
    }
    if redis is not None:
        config["store"] = {"url": redis.url, "prefix": prefix}
    return config


async def call(client: Client, text: str) -> float:
    started = time.perf_counter()
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool(TOOL, {"text": text})
    if result.is_error:
        raise RuntimeError(f"{TOOL} failed: {result.content}")
    return time.perf_counter() - started


async def sequential(url: str, name: str, calls: int, mode: str) -> Row:
    row = Row(name, "sequential")
    async with Client(url, mode=mode) as client:  # pyright: ignore[reportArgumentType]
        for i in range(WARMUP):
            await call(client, f"warm {i}")
        started = time.perf_counter()
        for i in range(calls):
            row.latencies.append(await call(client, f"one two {i}"))
        row.seconds = time.perf_counter() - started
    return row


async def concurrent(url: str, name: str, callers: int, per_caller: int, mode: str) -> Row:
    row = Row(name, f"{callers} concurrent")
    ready, go = anyio.Semaphore(0), anyio.Event()
    finished: list[float] = []
    started = 0.0

    async def one(index: int) -> None:
        async with Client(url, mode=mode) as client:  # pyright: ignore[reportArgumentType]
            for i in range(3):
                await call(client, f"warm {i}")
            ready.release()
            await go.wait()
            for i in range(per_caller):
                row.latencies.append(await call(client, f"c{index} {i}"))
            finished.append(time.perf_counter())

    async with anyio.create_task_group() as tg:
        for index in range(callers):
            tg.start_soon(one, index)
        for _ in range(callers):
            await ready.acquire()
        started = time.perf_counter()
        go.set()
    row.seconds = max(finished) - started
    return row


@asynccontextmanager
async def scenario(redis: Redis | None, count: int, prefix: str) -> AsyncIterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as directory:
        async with replicas(gateway_config(redis, prefix), Path(directory), count=count) as cluster:
            yield cluster


async def measure(options: argparse.Namespace, redis: Redis) -> list[Row]:
    rows: list[Row] = []
    plans = [
        ("1 replica", None, 1, False),
        ("1 replica + store", redis, 1, False),
        ("1 replica + store, via nginx", redis, 1, True),
        ("2 replicas + store, via nginx", redis, 2, True),
    ]
    for index, (name, store, count, balanced) in enumerate(plans):
        if options.rows and str(index) not in options.rows.split(","):
            continue
        print(f"measuring: {name}", file=sys.stderr)
        async with scenario(store, count, f"bench{index}") as cluster:
            url = cluster.url if balanced else cluster.endpoint(0)
            rows.append(await sequential(url, name, options.calls, options.mode))
            per_caller = max(1, options.calls // options.concurrency * 2)
            rows.append(await concurrent(url, name, options.concurrency, per_caller, options.mode))
    return rows


@dataclass
class Failover:
    waits: list[float] = field(default_factory=list)
    """Seconds from the kill to each client's next answered call."""
    failed: int = 0
    answered: int = 0


async def failover(redis: Redis, clients: int, mode: str) -> Failover:
    out = Failover()
    async with scenario(redis, 2, "failover") as cluster:
        killed = anyio.Event()
        killed_at = 0.0
        stop = anyio.Event()

        async def one(index: int) -> None:
            with anyio.move_on_after(60):
                await calling(index)
            print(f"failover: client {index} done", file=sys.stderr)

        async def calling(index: int) -> None:
            async with Client(cluster.url, mode=mode) as client:  # pyright: ignore[reportArgumentType]
                waiting = True
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        await call(client, f"f{index} {i}")
                    except Exception:
                        out.failed += 1
                        continue
                    out.answered += 1
                    if killed.is_set() and waiting:
                        waiting = False
                        out.waits.append(time.perf_counter() - killed_at)

        async with anyio.create_task_group() as tg:
            for index in range(clients):
                tg.start_soon(one, index)
            await anyio.sleep(2.0)  # all calling, each session held by both replicas
            killed_at = time.perf_counter()
            cluster.kill(0)
            killed.set()
            print("failover: replica 0 killed", file=sys.stderr)
            await anyio.sleep(3.0)
            stop.set()
        print("failover: stopping the cluster", file=sys.stderr)
    return out


def table(rows: list[Row]) -> str:
    base = {r.load: r for r in rows if r.name == "1 replica"} or {r.load: r for r in rows[:2]}
    lines = [
        "| scenario | load | calls/s | vs 1 replica | p50 ms | p99 ms | p50 minus baseline, ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = base[r.load]
        ratio = r.calls_per_second / b.calls_per_second if b.calls_per_second else 0.0
        delta = r.percentile(0.5) - b.percentile(0.5)
        lines.append(
            f"| {r.name} | {r.load} | {r.calls_per_second:.0f} | {ratio:.2f} | "
            f"{r.percentile(0.5):.2f} | {r.percentile(0.99):.2f} | {delta:+.2f} |"
        )
    return "\n".join(lines)


def failover_table(result: Failover, clients: int) -> str:
    waits = sorted(result.waits)
    median = statistics.median(waits) * 1e3 if waits else float("nan")
    return "\n".join(
        [
            "| clients | answered | failed | continued | wait after kill, median ms | max ms |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {clients} | {result.answered} | {result.failed} | {len(waits)}/{clients} | "
            f"{median:.0f} | {max(waits) * 1e3 if waits else float('nan'):.0f} |",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mode", choices=["legacy", "auto"], default="legacy")
    parser.add_argument("--failover-clients", type=int, default=8)
    parser.add_argument(
        "--rows", default="", help="only these scenarios, by index (0,1,2,3); the first is the baseline"
    )
    parser.add_argument("--no-failover", action="store_true")
    options = parser.parse_args()
    with redis_server() as redis:
        rows = anyio.run(measure, options, redis)
        result = (
            None
            if options.no_failover
            else anyio.run(failover, redis, options.failover_clients, options.mode)
        )
    print(f"$ {shlex.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}\n")
    print(table(rows))
    if result is not None:
        print()
        print(failover_table(result, options.failover_clients))


if __name__ == "__main__":
    main()
