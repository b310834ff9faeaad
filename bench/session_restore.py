"""What writing lost session records again costs a replica: the keeper's sweep
(``store/keeper.py``) over N held sessions against a real Redis, next to what writing the
same records cost when their sessions opened (one ``initialize`` each), in the same run.

Three timings per size, each the median of ``--repeat`` runs:

- ``opened``: each record written as its session's ``initialize`` writes it (one round trip
  each, N of them one after another): the baseline;
- ``restore, all lost``: the store flushed, then the keeper's sweep writes every record
  again (``SessionRecords.restore``, batches of 500 per round trip);
- ``restore, none lost``: the sweep when nothing was lost (each record checked, none
  written): what a false alarm costs;

and the longest the event loop went without running another task during the lost sweep
and during the baseline (a ticker every 1 ms measures it): the sweep must not stall the
replica's requests much more than its ordinary store traffic does.

Run from the repository root::

    .venv/bin/python bench/session_restore.py [--sizes 1000,10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import mcp_types as types
import redis.asyncio as aioredis

from agent_gateway.config import StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.keeper import Held, SessionKeeper
from agent_gateway.store.sessions import SessionRecord, SessionRecords

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.replicas.services import redis_server

_PARAMS = types.InitializeRequestParams(
    protocol_version="2025-11-25",
    capabilities=types.ClientCapabilities(),
    client_info=types.Implementation(name="bench", version="1"),
)


class _Held(Held):
    def __init__(self, records: list[SessionRecord]) -> None:
        self._records = {r.id: r for r in records}

    def record(self, session_id: str) -> SessionRecord | None:
        return self._records.get(session_id)

    def records(self) -> list[SessionRecord]:
        return list(self._records.values())


async def _stall(run: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Seconds ``run`` took, and the longest gap between two 1 ms ticks meanwhile."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    took = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        start = time.perf_counter()
        await run()
        took = time.perf_counter() - start
        tg.cancel_scope.cancel()
    return took, max(gaps, default=0.0)


async def _open_each(records: SessionRecords, held: list[SessionRecord]) -> None:
    for record in held:
        await records.opened(record)


async def _size(url: str, count: int, repeat: int) -> dict[str, float]:
    store = SharedStore(StoreConfig(url=url, prefix="bench"))
    await store.start()
    records = SessionRecords(store, 3600, "bench")
    keeper = SessionKeeper(store, records)
    held = [SessionRecord(f"s{i:06d}", f"client-{i % 50}", None, _PARAMS, "2025-11-25") for i in range(count)]
    keeper.keep(_Held(held))
    times: dict[str, list[float]] = {"opened": [], "lost": [], "none": [], "stall": [], "stall_opened": []}
    async with aioredis.Redis.from_url(url) as client:
        for _ in range(repeat):
            await client.flushall()
            took, stall = await _stall(lambda: _open_each(records, held))
            times["opened"].append(took)
            times["stall_opened"].append(stall)
            await client.flushall()
            took, stall = await _stall(lambda: keeper._restore(held, "bench"))  # pyright: ignore[reportPrivateUsage]
            times["lost"].append(took)
            times["stall"].append(stall)
            assert await client.exists(*(f"bench:session:{r.id}" for r in held[:100])) == 100
            start = time.perf_counter()
            await keeper._restore(held, "bench")  # pyright: ignore[reportPrivateUsage]
            times["none"].append(time.perf_counter() - start)
    await store.close()
    return {k: statistics.median(v) for k, v in times.items()}


async def main(sizes: list[int], repeat: int) -> None:
    with redis_server() as redis:
        rows = [(n, await _size(redis.url, n, repeat)) for n in sizes]
    print("command: .venv/bin/python bench/session_restore.py " + shlex.join(sys.argv[1:]))
    print()
    print(
        "| held sessions | opened, one by one (baseline) ms | restore, all lost ms | vs baseline | restore, none lost ms | longest event-loop stall, restore / opened ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n, t in rows:
        print(
            f"| {n:,} | {t['opened'] * 1000:.0f} | {t['lost'] * 1000:.0f} | {t['lost'] / t['opened']:.2f} "
            f"| {t['none'] * 1000:.0f} | {t['stall'] * 1000:.0f} / {t['stall_opened'] * 1000:.0f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, [int(s) for s in args.sizes.split(",")], args.repeat)
