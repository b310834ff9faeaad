"""What a replica did while Redis could not be told, told when it answers (before any record
is written again): sessions deleted, log levels set, subscriptions let go; and a new session's
first requests, which find nothing lost."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import redis.asyncio as aioredis

from agent_gateway.config import StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.sessions import SessionRecords
from tests.replicas.cluster import Cluster
from tests.replicas.services import Redis, redis_server
from tests.replicas.test_restore import PING, adopted_by, counter_replicas, recorder_replicas, request
from tests.replicas.test_sessions import BOUND
from tests.replicas.test_store import ACCEPT, opened

SETTLE = 8.0
"""Seconds for a replica to see the store answer again and sweep (watch 1 s, look 2 s)."""
UNSAID = 60_000
"""Deletions told once the store answers: more than one pipeline holds under the timeout (0.5 s)."""
ATTEMPTS = 3
"""Times the store is found answering again. A batch takes ~12 ms here, but a stall of the shared
CI machine once held one past the timeout; what a batch told stays told, so the next attempt goes
on from there. One pipeline of them all outlasts the timeout each time."""


async def unavailable_to(http: httpx.AsyncClient, cluster: Cluster, replica: int) -> None:
    """Until ``replica`` found the (frozen) store unavailable: its keeper's look every 2 s
    times out. A command sent to a frozen Redis is run when it thaws: none is sent after."""
    with anyio.fail_after(BOUND):
        while (await http.get(f"{cluster.replicas[replica]}/readyz")).status_code == 200:
            await anyio.sleep(0.2)


async def test_thousands_of_deletions_unsaid_are_told_when_the_store_answers(
    prefix: str,
) -> None:
    # Told in one pipeline, they outlasted the store's timeout every time (and marked it down
    # again): no sweep ever ran after. A batch at a time, each within it.
    with redis_server() as redis:
        store = SharedStore(StoreConfig(url=redis.url, prefix=prefix, timeout=0.5))
        await store.start()
        records = SessionRecords(store, 60, "replica-a")
        try:
            redis.stop()
            for i in range(UNSAID):  # DELETEs served meanwhile (the first finds it down)
                await records.ended(f"s{i:032x}")
            redis.start()
            told = False
            for _ in range(ATTEMPTS):  # as the keeper does, each time the store answers again
                await store.start()
                if told := await records.say_unsaid():
                    break
            async with aioredis.Redis.from_url(redis.url) as client:
                tombstones = await client.exists(*(f"{prefix}:ended:s{i:032x}" for i in (0, UNSAID - 1)))
            problem = store.problem
        finally:
            await store.close()
    assert (told, problem, tombstones) == (True, None, 2)


async def test_a_log_level_set_while_redis_was_unreachable_reaches_the_record(
    prefix: str, tmp_path: Path
) -> None:
    # Replica 0 serves logging/setLevel while Redis is frozen (data kept): neither the record
    # nor the other replicas hear of it then. A restore only adds fields the record lacks:
    # the level must be told as such when Redis answers.
    with redis_server() as redis:
        async with (
            counter_replicas(redis, prefix, tmp_path) as (cluster, http),
            aioredis.Redis.from_url(redis.url) as client,
        ):
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            session = headers["Mcp-Session-Id"]
            await adopted_by(http, cluster, 1, headers)
            redis.freeze()
            try:
                await unavailable_to(http, cluster, 0)  # what it does now is not sent
                level = request(2, "logging/setLevel", {"level": "error"})
                answer = await http.post(cluster.endpoint(0), json=level, headers=headers)
                assert answer.status_code == 200, answer.text
            finally:
                redis.thaw()
            with anyio.fail_after(SETTLE):
                while await client.hget(f"{prefix}:session:{session}", "level") != b"error":
                    await anyio.sleep(0.2)
            recorded = await client.hget(f"{prefix}:session:{session}", "level")
            assert "answers again" in cluster.log(0)
    assert recorded == b"error"


async def test_a_subscription_dropped_while_redis_was_unreachable_leaves_the_record_once_it_answers(
    prefix: str, tmp_path: Path
) -> None:
    # The client unsubscribes through replica 0 while Redis is frozen: the HDEL fails. Left in
    # the record, 'sub:<uri>' names replica 0, which no longer holds it: had replica 0 died,
    # the replica serving the stream would have subscribed again for a client that left.
    with redis_server() as redis:
        async with (
            recorder_replicas(redis, prefix, tmp_path) as (cluster, http),
            aioredis.Redis.from_url(redis.url) as client,
        ):
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            key = f"{prefix}:session:{headers['Mcp-Session-Id']}"
            subscribe = request(2, "resources/subscribe", {"uri": "counter://value"})
            unsubscribe = request(3, "resources/unsubscribe", {"uri": "counter://value"})
            assert (await http.post(cluster.endpoint(0), json=subscribe, headers=headers)).status_code == 200
            assert await client.hexists(key, "sub:counter://value")
            redis.freeze()
            try:
                await unavailable_to(http, cluster, 0)  # what it does now is not sent
                answer = await http.post(cluster.endpoint(0), json=unsubscribe, headers=headers)
                assert answer.status_code == 200, answer.text
            finally:
                redis.thaw()
            with anyio.fail_after(SETTLE):
                while await client.hexists(key, "sub:counter://value"):
                    await anyio.sleep(0.2)
            left = await client.hget(key, "sub:counter://value")
            assert "answers again" in cluster.log(0)
    assert left is None


async def test_a_new_sessions_first_requests_find_nothing_lost(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # Nothing is lost here. Yet the request that follows initialize (notifications/initialized,
    # sent as soon as the answer arrives) was admitted before the opening request was settled
    # (its reservation replaced by the session in the client's count): the touch's
    # ZADD XX CH found no member, said "lost", and the replica ran the restore script inline
    # in admission (a second round trip before the request is served). HSETNX is only in it.
    # The session is now counted as its answer starts, before the next request can come; the
    # touch's own rule is the next test's.
    async with (
        counter_replicas(redis, prefix, tmp_path, 1) as (cluster, http),
        aioredis.Redis.from_url(redis.url) as client,
    ):
        await client.config_resetstat()

        async def one() -> None:
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            assert (await http.post(cluster.endpoint(0), json=PING, headers=headers)).status_code == 200

        async with anyio.create_task_group() as tg:  # clients opening sessions at once
            for _ in range(40):
                tg.start_soon(one)
        stats = await client.info("commandstats")
    restores = stats.get("cmdstat_hsetnx", {}).get("calls", 0) // 5  # five fields a record
    assert restores == 0


async def test_a_session_the_count_lost_is_counted_again_and_not_restored(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # The count (a sorted set) and the session's record are apart: a request finding itself
    # gone from the count only is counted again as it is touched. Taken for a lost session,
    # it ran the restore script inline (HSETNX of the record's fields) for a record intact.
    async with (
        counter_replicas(redis, prefix, tmp_path, 1, session_idle_timeout=10) as (cluster, http),
        aioredis.Redis.from_url(redis.url) as client,
    ):
        headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
        session = headers["Mcp-Session-Id"].encode()
        (count,) = [
            key async for key in client.scan_iter(f"{prefix}:sessions:*") if await client.zscore(key, session)
        ]
        await anyio.sleep(1.5)  # past the replica's touch interval (a tenth of the idle timeout)
        await client.zrem(count, session)
        await client.config_resetstat()
        assert (await http.post(cluster.endpoint(0), json=PING, headers=headers)).status_code == 200
        stats = await client.info("commandstats")
        counted = await client.zscore(count, session)
    assert stats.get("cmdstat_hsetnx", {}).get("calls", 0) == 0
    assert counted is not None


async def test_a_session_held_elsewhere_is_answered_retry_not_gone_while_the_store_is_away(
    prefix: str, tmp_path: Path
) -> None:
    # "Session not found" tells a client its session ended: it starts a new one, its state
    # lost to a moment's outage. The replica that cannot look the session up says "retry".
    with redis_server() as redis:
        async with counter_replicas(redis, prefix, tmp_path) as (cluster, http):
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            redis.freeze()
            try:
                await unavailable_to(http, cluster, 1)
                away = await http.post(cluster.endpoint(1), json=PING, headers=headers)
                held = await http.post(cluster.endpoint(0), json=PING, headers=headers)
            finally:
                redis.thaw()
            await adopted_by(http, cluster, 1, headers)
    assert (away.status_code, away.headers.get("retry-after"), held.status_code) == (503, "1", 200)
    assert away.json()["error"]["message"] == "the shared session store does not answer: retry shortly"
    assert "not looked up: the shared store does not answer" in cluster.log(1)


async def test_subscriptions_dropped_while_redis_was_unreachable_are_kept_to_tell_within_16_mib(
    prefix: str,
) -> None:
    # A field's name holds the URI a client chose: 300 unsubscribes naming 1 MB URIs kept
    # 0.9 MB each until the store answered, bounded by count alone (100,000 of them).
    uris = [f"note://{i:02}" + "x" * (1 << 20) for i in range(24)]
    with redis_server() as redis:
        store = SharedStore(StoreConfig(url=redis.url, prefix=prefix, timeout=0.5))
        await store.start()
        records = SessionRecords(store, 60, "replica-a")
        key = f"{prefix}:session:s1"
        try:
            redis.stop()
            for uri in uris:
                await records.drop_field("s1", f"sub:{uri}", "subscription_drop")
            redis.start()
            await store.start()
            async with aioredis.Redis.from_url(redis.url) as client:
                await client.hset(key, mapping={"client": "c", **{f"sub:{uri}": "b" for uri in uris}})  # pyright: ignore[reportGeneralTypeIssues]
                told = await records.say_unsaid()
                left = await client.hlen(key)  # pyright: ignore[reportGeneralTypeIssues]
        finally:
            await store.close()
    # Told: the first 15 (16 MiB); forgotten: the rest, which their records keep.
    assert (told, left) == (True, 1 + 24 - 15)
