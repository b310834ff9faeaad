"""What the shared store counts for each client (found by a helper's attack on two replicas,
stop 51): anonymous clients counted apart, by address, as each replica counts them; a session
ended before its opening request was settled not counted for half an hour; another client
naming a session's id putting off none of its owner's touches; a header-long id not kept."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import redis.asyncio as aioredis

from agent_gateway.access import AccessControl, Principal
from agent_gateway.config import AuthConfig, StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.limits import SharedLimits, Verdict
from tests.replicas.services import Redis, redis_server
from tests.replicas.test_sessions import BOUND, cluster_of
from tests.security.test_hostile_load import HEADERS, INITIALIZE


async def test_anonymous_clients_are_counted_apart_by_address_across_replicas(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # Without auth every client's subject is "anonymous": counted by it, one address's
    # sessions shut every other address out, on every replica, for half an hour.
    capped = {"mode": "none", "policies": {"default": {"max_sessions": 3}}}
    async with cluster_of(redis, prefix, tmp_path, [], auth=capped) as cluster:

        async def opening(replica: int, address: str) -> int:
            transport = httpx.AsyncHTTPTransport(local_address=address)
            async with httpx.AsyncClient(transport=transport, timeout=BOUND) as http:
                answer = await http.post(cluster.endpoint(replica), json=INITIALIZE, headers=HEADERS)
            return answer.status_code

        assert [await opening(n % 2, "127.0.0.1") for n in range(3)] == [200, 200, 200]
        # At its cap, counted across the replicas: each new one ends one of its idle sessions.
        assert await opening(1, "127.0.0.1") == 200
        assert await opening(0, "127.0.0.2") == 200  # another address: a count of its own
        assert await opening(1, "127.0.0.2") == 200
        async with raw_client(redis) as raw:
            counted = [await raw.zcard(f"{prefix}:sessions:anonymous@127.0.0.{n}") for n in (1, 2)]
    assert counted == [3, 2]


async def test_behind_the_balancer_anonymous_clients_are_counted_by_their_own_address_which_they_cannot_name(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # nginx passed a client's X-Forwarded-For on, and the replicas believed whatever came from
    # loopback: a client naming a new address each time was a new anonymous client each time
    # (200 of 200 sessions against max_sessions 3); one that named none shared 127.0.0.1, the
    # balancer's address, with every other client, and shut them all out.
    capped = {"mode": "none", "policies": {"default": {"max_sessions": 3}}}
    async with cluster_of(redis, prefix, tmp_path, [], auth=capped) as cluster:

        async def opening(address: str, named: str | None = None) -> int:
            headers = HEADERS | ({"X-Forwarded-For": named} if named else {})
            transport = httpx.AsyncHTTPTransport(local_address=address)
            async with httpx.AsyncClient(transport=transport, timeout=BOUND) as http:
                return (await http.post(cluster.url, json=INITIALIZE, headers=headers)).status_code

        forged = [await opening("127.0.0.2", f"10.0.0.{n}") for n in range(5)]
        assert forged == [200] * 5  # past 3, each ends one of its own (store/room.py)
        assert await opening("127.0.0.3") == 200  # another address behind the balancer: its own count
        async with raw_client(redis) as raw:
            counted = await raw.zcard(f"{prefix}:sessions:anonymous@127.0.0.2")
    assert counted == 3  # counted as 127.0.0.2, whatever it named


@asynccontextmanager
async def raw_client(redis: Redis) -> AsyncIterator[aioredis.Redis]:
    raw = aioredis.from_url(redis.url)
    try:
        yield raw
    finally:
        await raw.aclose()


async def test_a_client_that_opens_one_session_and_never_comes_back_leaves_no_key_for_ever(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # Settling the opening request removed its reservation, the set's one member: the set went,
    # with its expiry, and the session's id added after made it again with none (301 such
    # clients, 301 keys kept for ever).
    async with cluster_of(redis, prefix, tmp_path, [], auth={"mode": "none"}) as cluster:
        async with httpx.AsyncClient(timeout=BOUND) as http:
            answer = await http.post(cluster.endpoint(0), json=INITIALIZE, headers=HEADERS)
        assert answer.status_code == 200
        key = f"{prefix}:sessions:anonymous@127.0.0.1"
        async with raw_client(redis) as raw:
            with anyio.fail_after(BOUND):  # settled once the answer is written
                while await raw.zscore(key, answer.headers["mcp-session-id"]) is None:
                    await anyio.sleep(0.02)
            ttl = await raw.ttl(key)
    assert 0 < ttl <= 1900, ttl  # the session's own: its idle timeout and a touch interval


def anonymous(address: str) -> Principal:
    return AccessControl(AuthConfig()).principal(None, address)


async def limits_on(redis: Redis, prefix: str) -> SharedLimits:
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix))
    await store.start()

    async def lost(_: str) -> None:
        pass

    return SharedLimits(store, 60.0, lost)


async def test_a_session_ended_before_its_opening_is_settled_is_not_counted(
    redis: Redis, prefix: str
) -> None:
    limits, client = await limits_on(redis, prefix), anonymous("127.0.0.1")
    verdict = await limits.admit(client, None, opening=True)
    assert verdict is not None
    assert verdict.reservation is not None
    session = uuid.uuid4().hex
    # Its DELETE, on another replica, ends it (the record gone, a tombstone left) before the
    # opening request's settle here, which comes after the answer was sent.
    async with aioredis.Redis.from_url(redis.url) as store:
        await store.set(f"{prefix}:ended:{session}", "1", ex=60)
        await limits.settle(client, verdict.reservation, session)
        assert await store.zcard(f"{prefix}:sessions:{client.label}") == 0
        # A session not ended is counted as before.
        again = await limits.admit(client, None, opening=True)
        assert again is not None
        assert again.reservation is not None
        await limits.settle(client, again.reservation, uuid.uuid4().hex)
        assert await store.zcard(f"{prefix}:sessions:{client.label}") == 1
    await limits.store.redis.aclose()


async def test_another_client_naming_a_session_puts_off_none_of_its_owners_touches(
    redis: Redis, prefix: str
) -> None:
    limits = await limits_on(redis, prefix)
    owner, other, session = anonymous("127.0.0.1"), anonymous("127.0.0.2"), uuid.uuid4().hex
    assert limits.needed(other, session, opening=False)  # its touch of the id it names (refused)
    assert limits.needed(owner, session, opening=False)  # the owner's own still due
    assert not limits.needed(owner, session, opening=False)  # and then not again for a while
    # An id as long as a header is no id a replica issues: nothing asked of the store, nothing kept.
    assert not limits.needed(owner, "x" * 60_000, opening=False)
    await limits.store.redis.aclose()


async def test_connections_a_restarted_redis_closed_are_replaced_not_taken_for_an_outage(prefix: str) -> None:
    # Each pooled connection Redis closed as it restarted failed its next command, used
    # seconds or minutes later, and marked the store unavailable anew: 503s for sessions held
    # elsewhere, records not written (then 404s on the other replica). Found by a helper's
    # attack on two replicas (stop 51).
    with redis_server() as redis:
        limits, client = await limits_on(redis, prefix), anonymous("127.0.0.1")

        async def admitted(verdicts: list[Verdict | None]) -> None:
            verdicts.append(await limits.admit(client, None, opening=True))

        before: list[Verdict | None] = []
        async with anyio.create_task_group() as tg:  # 20 at once: 20 connections in the pool
            for _ in range(20):
                tg.start_soon(admitted, before)
        redis.stop()
        redis.start()  # empty, and every pooled connection closed
        after: list[Verdict | None] = []
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(admitted, after)
        assert limits.store.available, limits.store.problem
        await limits.store.redis.aclose()
    assert None not in before
    assert None not in after
