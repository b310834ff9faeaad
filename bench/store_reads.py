"""What a replica's reads of the shared store cost, bounded (``store/record.py``'s ``READ``,
``store/events.py``'s ``_PAGE_READ``) against the unbounded reads they replaced (``HGETALL``
and ``XRANGE``, reproduced here), in the same run against a real Redis:

- a session's record as a replica writes it (a few hundred bytes), read to adopt it: median
  microseconds a read (the common path: its cost must stay that of one round trip);
- the same record with one value of ``--huge`` MiB that something else wrote: the time of one
  read and the process's peak memory above what it held before (``VmHWM``, reset first);
- a stream of SSE events with four events of ``--huge`` MiB, one page read for a resume.

Run from the repository root::

    .venv/bin/python bench/store_reads.py [--reads 2000] [--huge 64]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types

from agent_gateway.config import EventsConfig, StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.events import SharedEventStore
from agent_gateway.store.record import SessionRecord
from agent_gateway.store.sessions import SessionRecords

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.replicas.services import redis_server

_PARAMS = types.InitializeRequestParams(
    protocol_version="2025-11-25",
    capabilities=types.ClientCapabilities(),
    client_info=types.Implementation(name="bench", version="1"),
)


def _memory_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def _reset_peak() -> None:
    """``VmHWM`` counted from now on."""
    Path("/proc/self/clear_refs").write_text("5")


async def _peak(read: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Seconds one ``read`` took, and MB the process's peak rose above what it held before."""
    _reset_peak()
    before = _memory_mb("VmRSS")
    started = time.perf_counter()
    await read()
    return time.perf_counter() - started, max(0.0, _memory_mb("VmHWM") - before)


async def _median_us(read: Callable[[], Awaitable[Any]], reads: int) -> float:
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        await read()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def run(reads: int, huge: int) -> None:
    with redis_server() as server:
        store = SharedStore(StoreConfig(url=server.url, prefix="bench", timeout=30))
        await store.start()
        records = SessionRecords(store, 300, "bench")
        await records.opened(SessionRecord("small", "alice", None, _PARAMS, "2025-11-25"))
        await records.opened(SessionRecord("huge", "alice", None, _PARAMS, "2025-11-25"))
        await store.redis.hset(store.key("session", "huge"), "params", b"x" * (huge << 20))  # pyright: ignore[reportUnknownMemberType, reportArgumentType]

        def whole(session_id: str) -> Callable[[], Awaitable[Any]]:
            async def find() -> SessionRecord | None:  # the read before: HGETALL, then the record
                fields: dict[bytes, bytes] = await store.redis.hgetall(store.key("session", session_id))  # pyright: ignore[reportUnknownMemberType, reportAssignmentType]
                return SessionRecord.parse(session_id, fields) if fields else None

            return find

        print(f"$ {shlex.join(['.venv/bin/python', *sys.argv])}\n")
        print("| read | before (unbounded) | after (bounded) | ratio |\n|---|---:|---:|---:|")
        old, new = (
            await _median_us(whole("small"), reads),
            await _median_us(lambda: records.find("small"), reads),
        )
        print(f"| a record as written, median us of {reads} | {old:.0f} | {new:.0f} | {new / old:.2f} |")
        (t_old, m_old), (t_new, m_new) = await _peak(whole("huge")), await _peak(lambda: records.find("huge"))
        print(
            f"| a record with {huge} MiB in one value: ms | {t_old * 1e3:.0f} | {t_new * 1e3:.1f} | {t_new / t_old:.3f} |"
        )
        print(f"| the same: peak MB above before | {m_old:.0f} | {m_new:.1f} | {m_new / max(m_old, 1):.3f} |")
        events = SharedEventStore(store, EventsConfig())
        key = store.key("events", "d")
        for n in range(4):
            await store.redis.xadd(key, {"s": "s", "i": f"x-{n}/d", "m": b"x" * (huge << 20)})  # pyright: ignore[reportUnknownMemberType, reportArgumentType]
        (t_old, m_old) = await _peak(lambda: store.redis.xrange(key, min="-", count=4))  # pyright: ignore[reportUnknownMemberType, reportUnknownLambdaType]
        (t_new, m_new) = await _peak(lambda: events._page("d", "-"))  # pyright: ignore[reportPrivateUsage]
        print(
            f"| a page of 4 events of {huge} MiB: ms | {t_old * 1e3:.0f} | {t_new * 1e3:.0f} | {t_new / t_old:.2f} |"
        )
        print(f"| the same: peak MB above before | {m_old:.0f} | {m_new:.1f} | {m_new / max(m_old, 1):.3f} |")
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--huge", type=int, default=64, help="MiB of the oversized values")
    args = parser.parse_args()
    anyio.run(run, args.reads, args.huge)


if __name__ == "__main__":
    main()
