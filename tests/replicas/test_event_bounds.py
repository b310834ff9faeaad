"""What the SSE event store holds in Redis, and what a resume reads: bounded by age event by
event (a stream written to now and then kept all it ever held), by the size of one event
(one client's large answers put 1.2 GB in Redis in 19 s), and by what one resume replays
(20 resumes of a 40 MB stream held 1.4 GB on their replica). Found by a helper's attack on
two replicas (stop 51)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import redis.asyncio as aioredis
from mcp.server.streamable_http import EventMessage

from agent_gateway.config import EventsConfig, StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.events import Entry, SharedEventStore, stream_digest
from tests.replicas.services import Redis
from tests.replicas.test_sessions import cluster_of
from tests.security.test_hostile_load import HEADERS, INITIALIZE

BOUND = 10.0
STREAM = "session-1:request-1"


def note(size: int) -> types.JSONRPCNotification:
    return types.JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"data": "x" * size}
    )


@asynccontextmanager
async def event_store(
    redis: Redis, prefix: str, **events: int
) -> AsyncIterator[tuple[SharedEventStore, aioredis.Redis]]:
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix))
    await store.start()
    shared = SharedEventStore(store, EventsConfig(**events))  # pyright: ignore[reportArgumentType]
    async with aioredis.Redis.from_url(redis.url) as raw, anyio.create_task_group() as tg:
        await tg.start(shared.write)
        yield shared, raw
        tg.cancel_scope.cancel()
    await store.redis.aclose()


async def stored(raw: aioredis.Redis, prefix: str, count: int) -> int:
    """The stream's length in Redis, once the writer has written ``count`` events (or at once)."""
    key = f"{prefix}:events:{stream_digest(STREAM)}"
    with anyio.fail_after(BOUND):
        while (length := await raw.xlen(key)) < count:
            await anyio.sleep(0.02)
    return length


async def ids_in(raw: aioredis.Redis, key: str) -> list[str]:
    entries: list[Entry] = await raw.xrange(key)  # pyright: ignore[reportAssignmentType]  # redis-py's union
    return [fields[b"i"].decode() for _, fields in entries]


async def replayed(shared: SharedEventStore, after: str) -> list[EventMessage] | None:
    got: list[EventMessage] = []

    async def send(event: EventMessage) -> None:
        got.append(event)

    return got if await shared.replay_events_after(after, send) is not None else None


async def test_an_event_past_the_bound_is_not_kept_and_the_others_are(redis: Redis, prefix: str) -> None:
    async with event_store(redis, prefix, max_event_bytes=4096) as (shared, raw):
        first = await shared.store_event(STREAM, note(10))
        await shared.store_event(STREAM, note(8192))
        last = await shared.store_event(STREAM, note(20))
        assert await stored(raw, prefix, 2) == 2
        events = await replayed(shared, first)
    assert events is not None
    assert [e.event_id for e in events] == [last]


async def test_events_older_than_the_ttl_go_while_their_stream_is_written_to(
    redis: Redis, prefix: str
) -> None:
    key = f"{prefix}:events:{stream_digest(STREAM)}"
    async with event_store(redis, prefix, ttl=60) as (shared, raw):
        # An event written two minutes ago (Redis stream ids start with their time in ms).
        seconds, _ = await raw.time()
        await raw.xadd(key, {"s": STREAM, "i": "old", "m": b"{}"}, id=f"{(seconds - 120) * 1000}-0")
        new = await shared.store_event(STREAM, note(10))
        with anyio.fail_after(BOUND):  # written, and the old one trimmed in the same pipeline
            while await ids_in(raw, key) != [new]:
                await anyio.sleep(0.02)


async def test_a_resume_past_the_replay_bound_is_refused_and_a_shorter_one_served(
    redis: Redis, prefix: str
) -> None:
    async with event_store(redis, prefix, max_replay_bytes=4096, max_event_bytes=4096) as (shared, raw):
        ids = [await shared.store_event(STREAM, note(1500)) for _ in range(5)]
        assert await stored(raw, prefix, 5) == 5
        refused = await replayed(shared, ids[0])  # four events of ~1.5 KB after it: over 4 KB
        served = await replayed(shared, ids[2])
    assert refused is None
    assert served is not None
    assert [e.event_id for e in served] == ids[3:]


async def test_a_replica_reads_a_few_resumes_at_once(redis: Redis, prefix: str) -> None:
    # Each resume holds what it replays until it is sent: 40 at once took a replica to 1.3 GB.
    async with event_store(redis, prefix) as (shared, raw):
        first = await shared.store_event(STREAM, note(10))
        await shared.store_event(STREAM, note(10))
        await stored(raw, prefix, 2)
        sending, go, at_once = [0], anyio.Event(), 0

        async def slow(_: EventMessage) -> None:  # a client reading slowly
            sending[0] += 1
            await go.wait()

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(shared.replay_events_after, first, slow)
            with anyio.fail_after(BOUND):
                while sending[0] < 4:
                    await anyio.sleep(0.01)
            await anyio.wait_all_tasks_blocked()  # the other two wait their turn, not Redis
            at_once = sending[0]
            go.set()
    assert at_once == 4
    assert sending[0] == 6


VERSIONS = ("2025-06-18", "2025-11-25")
"""A session whose stream is opened by its answer; one whose stream is opened by a priming event."""


async def test_a_deleted_sessions_event_streams_go_with_it(redis: Redis, prefix: str, tmp_path: Path) -> None:
    # Kept for their age (5 min), they outlived the session: a client opening and deleting
    # sessions in a loop left 4,325 streams (21 MB) in 30 s. A session of each version on one
    # cluster (each was a test of its own, two replicas started for each).
    async with (
        cluster_of(redis, prefix, tmp_path, [], auth={"mode": "none"}) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
        aioredis.Redis.from_url(redis.url) as raw,
    ):
        for version in VERSIONS:
            opening = INITIALIZE | {"params": {**INITIALIZE["params"], "protocolVersion": version}}
            opened = await http.post(cluster.endpoint(0), json=opening, headers=HEADERS)
            session = opened.headers["mcp-session-id"]
            streams = f"{prefix}:streams:{session}"
            with anyio.fail_after(BOUND):  # written behind
                while not (kept := [_text(key) for key in await raw.zrange(streams, 0, -1)]):
                    await anyio.sleep(0.02)
            assert await raw.exists(*kept) == len(kept), version
            ended = await http.delete(cluster.endpoint(1), headers=HEADERS | {"Mcp-Session-Id": session})
            assert ended.status_code == 200, version
            assert await raw.exists(streams, *kept) == 0, version


def _text(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)
