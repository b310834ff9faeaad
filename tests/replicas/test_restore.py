"""Session records the shared store lost while their sessions live on a replica (opened while
Redis was down; gone with a restart, or evicted) are written again by that replica, so the
other replicas adopt the session again and its client's count holds it again; a session
deleted meanwhile is not brought back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import redis.asyncio as aioredis

from agent_gateway.access import Principal
from agent_gateway.config import ClientPolicy, StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.holders import HEARTBEAT_TTL
from agent_gateway.store.limits import SharedLimits
from agent_gateway.store.record import SessionRecord, UpstreamRecord
from agent_gateway.store.sessions import SessionRecords
from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import Redis, redis_server
from tests.replicas.test_dedicated import visits_server
from tests.replicas.test_sessions import BOUND, config, counter_server
from tests.replicas.test_store import ACCEPT, UPDATED, events, opened
from tests.servers import recorder
from tests.support import serving_upstream

PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


async def adopted_by(
    http: httpx.AsyncClient, cluster: Cluster, replica: int, headers: dict[str, str]
) -> None:
    """Until ``replica`` serves the session of ``headers`` (it answered 404 while the store had
    no record of it)."""
    with anyio.fail_after(BOUND):
        while (
            await http.post(cluster.endpoint(replica), json=PING, headers={**headers, **ACCEPT})
        ).status_code != 200:
            await anyio.sleep(0.1)


async def recorded(client: aioredis.Redis, prefix: str, session: str) -> dict[str, str]:
    """Until the store holds ``session``'s record again; its fields."""
    fields: dict[bytes, bytes] = {}
    with anyio.fail_after(BOUND):
        while not fields:
            fields = await client.hgetall(f"{prefix}:session:{session}")  # pyright: ignore[reportGeneralTypeIssues, reportAssignmentType]
            await anyio.sleep(0.1)
    return {k.decode(): v.decode() for k, v in fields.items()}


ANONYMOUS = "anonymous@127.0.0.1"
"""The tests' client, anonymous on loopback: its sessions are counted by its address."""


async def counted(client: aioredis.Redis, prefix: str, session: str) -> bool:
    """Whether ``session`` is among the anonymous client's sessions across replicas."""
    return await client.zscore(f"{prefix}:sessions:{ANONYMOUS}", session) is not None


@asynccontextmanager
async def counter_replicas(
    redis: Redis, prefix: str, tmp_path: Path, count: int = 2, **server: Any
) -> AsyncIterator[tuple[Cluster, httpx.AsyncClient]]:
    """``count`` replicas of one counter upstream sharing ``redis``, and an HTTP client."""
    data = config(redis, prefix, "", **({"server": server} if server else {}))
    async with serving_upstream(counter_server([])) as upstream:
        data["upstreams"]["counter"]["url"] = upstream
        async with replicas(data, tmp_path, count) as cluster, httpx.AsyncClient(timeout=BOUND) as http:
            yield cluster, http


@asynccontextmanager
async def recorder_replicas(
    redis: Redis, prefix: str, tmp_path: Path, **server: Any
) -> AsyncIterator[tuple[Cluster, httpx.AsyncClient]]:
    """Two replicas of a handshake-era recorder upstream (its ``counter://value`` can be
    subscribed to) sharing ``redis``, and an HTTP client."""
    async with serving_upstream(recorder.build(lambda _: None)) as upstream:
        data = config(redis, prefix, upstream, **({"server": server} if server else {}))
        data["upstreams"] = {"rec": {"url": upstream, "protocol": "legacy"}}
        async with replicas(data, tmp_path) as cluster, httpx.AsyncClient(timeout=BOUND) as http:
            yield cluster, http


async def test_a_session_opened_while_redis_was_down_is_adopted_by_the_other_replica_once_it_is_back(
    prefix: str, tmp_path: Path
) -> None:
    with redis_server() as redis:
        async with counter_replicas(redis, prefix, tmp_path) as (cluster, http):
            redis.freeze()  # unreachable, its data kept (a restart would also lose them)
            try:
                headers = await opened(http, cluster.endpoint(0))  # served by replica 0 alone
            finally:
                redis.thaw()
            await adopted_by(http, cluster, 1, headers)
            async with aioredis.Redis.from_url(redis.url) as client:
                assert await counted(client, prefix, headers["Mcp-Session-Id"])
            metrics = (await http.get(f"{cluster.replicas[0]}/metrics")).text
    assert "session record(s) it no longer held written again (it answers again)" in cluster.log(0)
    [restored] = [
        line for line in metrics.splitlines() if line.startswith("agent_gateway_store_sessions_restored")
    ]
    assert restored.endswith(" 1.0")


async def test_records_a_flush_lost_are_written_again_as_they_are_now(prefix: str, tmp_path: Path) -> None:
    # Redis flushed (as a restart without persistence leaves it): every record gone, and no
    # operation failed on the replica that holds the session. Its record comes back with its
    # log level, its dedicated upstream session and the replica holding its subscription as
    # they are now, and its place in its client's count.
    with redis_server() as redis:
        async with (
            serving_upstream(recorder.build(lambda _: None)) as rec,
            serving_upstream(visits_server()) as visits,
        ):
            data = config(redis, prefix, rec)
            data["upstreams"] = {
                "rec": {"url": rec, "protocol": "legacy"},
                "visits": {"url": visits, "protocol": "legacy", "session": "per_client"},
            }
            async with replicas(data, tmp_path) as cluster, httpx.AsyncClient(timeout=BOUND) as http:
                headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
                session = headers["Mcp-Session-Id"]
                level = request(2, "logging/setLevel", {"level": "debug"})
                visit = request(3, "tools/call", {"name": "visits__visit"})
                subscribe = request(4, "resources/subscribe", {"uri": "counter://value"})
                for sent in (level, visit, subscribe):
                    assert (
                        await http.post(cluster.endpoint(0), json=sent, headers=headers)
                    ).status_code == 200
                async with aioredis.Redis.from_url(redis.url) as client:
                    before = await recorded(client, prefix, session)
                    await client.flushall()
                    after = await recorded(client, prefix, session)
                    assert await counted(client, prefix, session)
                await adopted_by(http, cluster, 1, headers)
    assert after == before
    assert after["level"] == "debug"
    assert "upstream:visits" in after
    assert "sub:counter://value" in after


async def test_a_record_the_store_evicted_is_written_again_by_the_next_request(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        counter_replicas(redis, prefix, tmp_path, session_idle_timeout=20) as (cluster, http),
        aioredis.Redis.from_url(redis.url) as client,
    ):
        headers = await opened(http, cluster.endpoint(0))
        session = headers["Mcp-Session-Id"]
        assert await client.delete(f"{prefix}:session:{session}", f"{prefix}:sessions:{ANONYMOUS}") == 2
        with anyio.fail_after(BOUND):  # each request pushes the expiry back every 2 s at most
            while not await client.exists(f"{prefix}:session:{session}"):
                assert (
                    await http.post(cluster.endpoint(0), json=PING, headers={**headers, **ACCEPT})
                ).status_code == 200
                await anyio.sleep(0.2)
        assert await counted(client, prefix, session)
        await adopted_by(http, cluster, 1, headers)
    assert "written again (its record was gone)" in cluster.log(0)


async def test_a_record_the_store_evicted_is_written_again_while_its_client_only_listens(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        counter_replicas(redis, prefix, tmp_path, session_idle_timeout=3) as (cluster, http),
        aioredis.Redis.from_url(redis.url) as client,
    ):
        headers = await opened(http, cluster.endpoint(0))
        session = headers["Mcp-Session-Id"]
        async with events(http, cluster.endpoint(0), headers):
            assert await client.delete(f"{prefix}:session:{session}") == 1
            await recorded(client, prefix, session)  # no request: the open stream finds it gone
            await adopted_by(http, cluster, 1, headers)


async def test_a_record_lost_is_written_again_by_the_replica_holding_only_its_stream(
    prefix: str, tmp_path: Path
) -> None:
    # A client that subscribed and then only listens: its stream is what moves to a replica
    # that survives the one it used, and that replica holds the session by it alone.
    with redis_server() as redis:
        async with recorder_replicas(redis, prefix, tmp_path) as (cluster, http):
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            session = headers["Mcp-Session-Id"]
            level = request(2, "logging/setLevel", {"level": "debug"})
            assert (await http.post(cluster.endpoint(0), json=level, headers=headers)).status_code == 200
            async with (
                events(http, cluster.endpoint(1), headers),
                aioredis.Redis.from_url(redis.url) as client,
            ):
                await recorded(client, prefix, session)
                cluster.kill(0)  # replica 1 alone holds the session now, by its stream
                await client.flushall()  # a restart without persistence: every record gone
                after = await recorded(client, prefix, session)
                assert await counted(client, prefix, session)
    assert after["level"] == "debug"
    assert "session record(s) it no longer held written again" in cluster.log(1)


def record(session: str, **extra: Any) -> SessionRecord:
    params = types.InitializeRequestParams(
        protocol_version="2025-11-25",
        capabilities=types.ClientCapabilities(),
        client_info=types.Implementation(name="raw", version="1"),
    )
    return SessionRecord(session, "alice", None, params, "2025-11-25", **extra)


async def test_restore_writes_only_what_is_gone_and_never_a_deleted_session(
    redis: Redis, prefix: str
) -> None:
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix))
    await store.start()
    records = SessionRecords(store, 60, "replica-a")
    upstream = UpstreamRecord(
        "up-1",
        types.InitializeResult(
            protocol_version="2025-11-25",
            capabilities=types.ServerCapabilities(),
            server_info=types.Implementation(name="visits", version="1"),
        ),
    )
    kept, gone, deleted = (
        record("kept"),
        record("gone", level="info", upstreams={"visits": upstream}),
        record("deleted"),
    )
    # Another replica holds a subscription of the kept session: what this one lacks is added,
    # what the record has is left as it is.
    held_elsewhere = replace(kept, level="debug", subscriptions={"counter://value": "replica-b"})
    try:
        await records.opened(kept)
        await records.opened(deleted)
        await records.ended("deleted")  # its client's DELETE, through any replica
        assert await records.restore([held_elsewhere, gone, deleted]) == [0, 1, -1]
        assert await records.find("kept") == kept
        assert await records.find("gone") == record("gone", level="info")
        assert await records.upstream_session("gone", "visits") == upstream
        assert await records.find("deleted") is None
        async with aioredis.Redis.from_url(redis.url) as client:
            assert await client.hget(f"{prefix}:session:kept", "sub:counter://value") == b"replica-b"
            assert await client.zscore(f"{prefix}:sessions:alice", "kept") is not None
            assert await client.zscore(f"{prefix}:sessions:alice", "gone") is not None
            assert await client.zscore(f"{prefix}:sessions:alice", "deleted") is None
    finally:
        await store.close()


async def test_a_touch_finds_a_lost_count_and_keeps_the_count_alive(redis: Redis, prefix: str) -> None:
    # A session that only listens is touched by its stream alone: its count must outlive the
    # expiry the last request gave it, and a count the store lost must be noticed.
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix))
    await store.start()
    records = SessionRecords(store, 60, "replica-a")
    count = f"{prefix}:sessions:alice"
    try:
        await records.opened(record("listening"))
        assert await records.touch("listening") is False  # never counted: lost
        async with aioredis.Redis.from_url(redis.url) as client:
            await client.zadd(count, {"listening": 0})
            await client.expire(count, 1)  # as a request's admission left it, long ago
            assert await records.touch("listening") is True
            assert await client.ttl(count) > 50
    finally:
        await store.close()


async def test_a_record_outlives_its_sessions_idle_timeout_by_the_touch_interval(
    redis: Redis, prefix: str
) -> None:
    # A replica's requests push a session's expiry back at most once a touch interval (6 s at
    # a 60 s idle timeout), so its last request may come that long after the last push: a
    # record kept for the idle timeout alone ran out before the replica's idle timer ended
    # the session, and a request in between wrote it again as lost (a WARNING for nothing).
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix))
    await store.start()
    records, lost = SessionRecords(store, 60, "replica-a"), list[str]()

    async def on_lost(session: str) -> None:
        lost.append(session)

    limits = SharedLimits(store, 60, on_lost=on_lost)
    alice = Principal("alice", "default", ClientPolicy())
    key, count = f"{prefix}:session:kept", f"{prefix}:sessions:alice"
    try:
        async with aioredis.Redis.from_url(redis.url) as client:
            kept = []
            await records.opened(record("kept"))
            kept.append(await client.ttl(key))
            assert await limits.admit(alice, "kept", opening=False) is not None
            kept.append(await client.ttl(key))
            now = (await client.time())[0]
            kept.append(int(await client.zscore(count, "kept") or 0) - now)
            assert await records.touch("kept") is True
            kept.append(await client.ttl(key))
            await client.delete(key)
            assert await records.restore([record("kept")]) == [1]
            kept.append(await client.ttl(key))
        assert all(seconds > 60 for seconds in kept), kept
        assert lost == []
    finally:
        await store.close()


async def test_a_session_deleted_while_redis_restarted_is_not_brought_back(
    prefix: str, tmp_path: Path
) -> None:
    # Replica 1 serves the DELETE while Redis is down: neither the tombstone nor the
    # announcement can be written then. When Redis is back, replica 1 tells it before it
    # writes anything again; replica 0, which also serves the session, must not bring it back
    # (had its look come first, the end it then hears removes what it wrote).
    with redis_server() as redis:
        async with counter_replicas(redis, prefix, tmp_path) as (cluster, http):
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            await adopted_by(http, cluster, 1, headers)
            redis.stop()
            try:
                deleted = await http.delete(cluster.endpoint(1), headers=headers)
            finally:
                redis.start()
            assert deleted.status_code == 200, deleted.text
            with anyio.fail_after(BOUND):  # replica 0 hears of it, late
                while (await http.post(cluster.endpoint(0), json=PING, headers=headers)).status_code != 404:
                    await anyio.sleep(0.1)
            async with aioredis.Redis.from_url(redis.url) as client:
                left = await client.exists(f"{prefix}:session:{headers['Mcp-Session-Id']}")
            with anyio.fail_after(BOUND):  # 503 ("retry") until replica 1 sees the store back
                while (
                    again := await http.post(cluster.endpoint(1), json=PING, headers=headers)
                ).status_code == 503:
                    await anyio.sleep(0.1)
    assert (left, again.status_code) == (0, 404)


async def test_a_session_deleted_elsewhere_unheard_is_dropped_when_its_record_is_found_gone(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        counter_replicas(redis, prefix, tmp_path, 1, session_idle_timeout=20) as (cluster, http),
        aioredis.Redis.from_url(redis.url) as client,
    ):
        headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
        session = headers["Mcp-Session-Id"]
        async with client.pipeline(transaction=True) as pipe:  # a DELETE elsewhere, unheard here
            pipe.delete(f"{prefix}:session:{session}")
            pipe.set(f"{prefix}:ended:{session}", "1", ex=20)
            pipe.zrem(f"{prefix}:sessions:{ANONYMOUS}", session)
            await pipe.execute()
        with anyio.fail_after(BOUND):  # the next touch finds it gone, and deleted
            while (await http.post(cluster.endpoint(0), json=PING, headers=headers)).status_code != 404:
                await anyio.sleep(0.2)
    assert "was deleted through another replica: dropped here" in cluster.log(0)


async def test_a_record_written_again_by_one_replica_gets_the_subscription_another_holds(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # The session opened on replica 0, its subscription held by replica 1. The store evicts
    # the record; replica 0's next request writes it again from what replica 0 holds, and
    # replica 1 adds its subscription: when replica 1 dies, the stream's replica takes it over.
    async with (
        recorder_replicas(redis, prefix, tmp_path, session_idle_timeout=20) as (cluster, http),
        aioredis.Redis.from_url(redis.url) as client,
    ):
        headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
        session = headers["Mcp-Session-Id"]
        subscribe = request(1, "resources/subscribe", {"uri": "counter://value"})
        assert (await http.post(cluster.endpoint(1), json=subscribe, headers=headers)).status_code == 200
        assert await client.delete(f"{prefix}:session:{session}") == 1
        with anyio.fail_after(BOUND):
            while not await client.hexists(f"{prefix}:session:{session}", "sub:counter://value"):
                await http.post(cluster.endpoint(0), json=PING, headers=headers)
                await anyio.sleep(0.2)
        holder: bytes = await client.hget(f"{prefix}:session:{session}", "sub:counter://value")  # pyright: ignore[reportGeneralTypeIssues, reportAssignmentType]
        cluster.kill(1)
        # Its heartbeat ends as its TTL would end it, 10 s sooner, and the stream opened now
        # claims at once, not at its next claim 5 s on (test_store's takeover test waits both).
        assert await client.delete(f"{prefix}:replica:{holder.decode()}") == 1
        async with events(http, cluster.endpoint(0), headers) as reader:
            with anyio.fail_after(HEARTBEAT_TTL + BOUND):
                _, told = await reader.__anext__()
    assert told == UPDATED  # taken over: "it may have changed while nobody relayed its updates"
