"""A subscription its client drops through a replica other than the one holding it is left
by its holder (found by a helper's attack on two replicas, stop 56). Before, the holder kept
it subscribed upstream, relaying updates the client had unsubscribed from, and when its copy
of the session ended it let the subscription go as still wanted, so the replica holding the
session's stream took it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis

from agent_gateway.config import StoreConfig
from agent_gateway.store.bus import Bus
from agent_gateway.store.client import SharedStore
from agent_gateway.store.holders import SubscriptionHolders
from agent_gateway.store.sessions import SessionRecords
from tests.replicas.services import Redis
from tests.replicas.test_sessions import BOUND
from tests.replicas.test_store import SUBSCRIBE, recorder_cluster

UNSUBSCRIBE = {"id": 2, "method": "resources/unsubscribe", "params": {"uri": "counter://value"}}


def events_of(seen: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["uri"] for e in seen if e["event"] == kind]


async def test_a_subscription_dropped_through_another_replica_is_left_upstream_by_its_holder(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    async with recorder_cluster(redis, prefix, tmp_path, seen) as session:
        await session.post(0, SUBSCRIBE)  # held by replica 0
        await session.post(1, UNSUBSCRIBE)  # dropped through replica 1
        with anyio.fail_after(BOUND):
            while not events_of(seen, "unsubscribe"):
                await anyio.sleep(0.02)
        async with aioredis.Redis.from_url(redis.url) as raw:
            fields: list[bytes] = await raw.hkeys(f"{prefix}:session:{session.headers['Mcp-Session-Id']}")  # pyright: ignore[reportGeneralTypeIssues, reportAssignmentType]
        log = session.cluster.log(0)
    assert events_of(seen, "subscribe") == ["counter://value"]
    assert events_of(seen, "unsubscribe") == ["counter://value"]
    assert not [f for f in fields if f.startswith(b"sub:")]
    assert "its subscription to counter://value dropped through another replica" in log


async def test_a_replica_lets_go_only_a_subscription_its_record_says_it_holds(
    redis: Redis, prefix: str
) -> None:
    # Its copy of the session ending, a replica lets its subscriptions go for the stream's
    # holder to take: not one another replica holds, nor one the client dropped meanwhile.
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix))
    await store.start()
    try:
        records = SessionRecords(store, 60.0, "a")
        holders = SubscriptionHolders(store, Bus(store, ()), records, "a")
        key = f"{prefix}:session:s1"
        async with aioredis.Redis.from_url(redis.url) as raw:
            await raw.hset(key, mapping={"client": "c", "sub:x://held-by-b": "b", "sub:x://mine": "a"})  # pyright: ignore[reportGeneralTypeIssues]
            for uri in ("x://held-by-b", "x://mine", "x://dropped"):
                await holders.let_go("s1", uri)
            fields = await raw.hgetall(key)  # pyright: ignore[reportGeneralTypeIssues]
    finally:
        await store.close()
    assert fields == {b"client": b"c", b"sub:x://held-by-b": b"b", b"sub:x://mine": b""}
