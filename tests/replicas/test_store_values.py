"""What a replica reads from the shared store is bounded: a value something else wrote into
Redis (a compromised peer, a tool run against the wrong database) is refused unread, and the
replica serves its other clients on."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import Redis
from tests.replicas.test_dedicated import visits_server
from tests.replicas.test_room import COUNT, capped, status
from tests.replicas.test_sessions import BOUND
from tests.replicas.test_store import ACCEPT, HELLO, VERSION, opened
from tests.security.test_bytes_in_flight import memory_mb, reset_peak
from tests.support import serving_upstream

HUGE = 32 << 20
"""Bytes written into one field of a session's record (a replica writes at most 64 KiB)."""
CONFIG: dict[str, Any] = {"agent": {"enabled": False}}


@asynccontextmanager
async def visited(
    redis: Redis, prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, httpx.AsyncClient]]:
    """Two replicas sharing ``redis`` over a handshake-era upstream (``visits``), and a client."""
    async with (
        serving_upstream(visits_server()) as upstream,
        replicas(
            {**CONFIG, "store": {"url": redis.url, "prefix": prefix}} | visits(upstream), tmp_path
        ) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        yield cluster, http


class Peak:
    """How far process ``pid``'s memory peaked over what it held when this was made."""

    def __init__(self, pid: int) -> None:
        reset_peak(pid)
        self._pid = pid
        self._before = memory_mb(pid, "VmRSS")

    def mb(self) -> float:
        return memory_mb(self._pid, "VmHWM") - self._before

    def check(self) -> None:
        """It grew by less than half of ``HUGE``: read whole, a value was held five times over."""
        grew = self.mb()
        assert grew < HUGE / 2 / (1 << 20), f"+{grew:.0f} MB at the peak"


def visits(url: str) -> dict[str, Any]:
    """A handshake-era upstream whose sessions are each client's own (their records shared)."""
    return {"upstreams": {"visits": {"url": url, "protocol": "legacy", "session": "per_client"}}}


VISIT = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "visits__visit", "arguments": {}},
}


@pytest.mark.parametrize(("field", "status"), [("params", 404), ("upstream:visits", 200)])
async def test_a_huge_value_in_a_session_record_is_not_read_and_the_replica_serves_on(
    redis: Redis, prefix: str, tmp_path: Path, field: str, status: int
) -> None:
    async with visited(redis, prefix, tmp_path) as (cluster, http):
        first, second = cluster.endpoint(0), cluster.endpoint(1)
        victim, bystander = await opened(http, first), await opened(http, first)
        for headers in (victim, bystander):  # each opens its dedicated upstream session
            assert (await http.post(first, json=VISIT, headers={**headers, **ACCEPT})).status_code == 200
        async with aioredis.Redis.from_url(redis.url) as peer:
            await peer.hset(f"{prefix}:session:{victim['Mcp-Session-Id']}", field, b"x" * HUGE)
        peak = Peak(cluster.processes[1].pid)
        named = await http.post(second, json=VISIT, headers={**victim, **ACCEPT})
        peak.check()
        # The store is still up on that replica: it adopts the bystander's session.
        served = await http.post(second, json=VISIT, headers={**bystander, **ACCEPT})
        log = cluster.log(1)
    # A record's params unread is a session not found; an upstream session's record unread,
    # a new upstream session for the call.
    assert named.status_code == status, named.text
    assert served.status_code == 200, served.text
    assert "over 1048576: not read" in log


def one_huge_value(stream: bytes, n: int) -> dict[bytes, bytes]:
    return {b"s": stream, b"i": f"peer-{n}/x".encode(), b"m": b"x" * HUGE}


def many_fields(stream: bytes, n: int) -> dict[bytes, bytes]:
    """As large, in fields of 1 KiB each (a replica writes three: s, i and m)."""
    fields = {f"f{k}".encode(): b"x" * 1024 for k in range(HUGE >> 10)}
    return {b"s": stream, b"i": f"peer-{n}/x".encode(), b"m": b"{}", **fields}


@pytest.mark.parametrize("event", [one_huge_value, many_fields], ids=["one-huge-value", "many-fields"])
async def test_a_huge_event_in_a_resumed_stream_is_not_read_and_the_replica_serves_on(
    redis: Redis, prefix: str, tmp_path: Path, event: Callable[[bytes, int], dict[bytes, bytes]]
) -> None:
    async with visited(redis, prefix, tmp_path) as (cluster, http):
        first, second = cluster.endpoint(0), cluster.endpoint(1)
        hello = await http.post(first, json=HELLO, headers=ACCEPT)
        resumed = {
            "Mcp-Session-Id": hello.headers["mcp-session-id"],
            "Mcp-Protocol-Version": VERSION,
            "Last-Event-ID": next(
                line[3:].strip() for line in hello.text.splitlines() if line.startswith("id:")
            ),
        }
        bystander = await opened(http, first)
        key = f"{prefix}:events:{resumed['Last-Event-ID'].split('/')[1]}"
        async with aioredis.Redis.from_url(redis.url) as peer:
            with anyio.fail_after(BOUND):  # the initialize's answer stored (written behind)
                while not await peer.xlen(key):
                    await anyio.sleep(0.02)
            stored = cast("list[Any]", await peer.xrange(key, count=1))  # redis-py: a union
            for n in range(2):  # what a compromised peer could add to the stream
                await peer.xadd(key, event(stored[0][1][b"s"], n))  # pyright: ignore[reportArgumentType]
        peak = Peak(cluster.processes[1].pid)
        async with http.stream("GET", second, headers={**resumed, "Accept": "text/event-stream"}):
            with anyio.fail_after(BOUND):
                while "replay refused" not in cluster.log(1):
                    await anyio.sleep(0.02)
        peak.check()
        served = await http.post(second, json=VISIT, headers={**bystander, **ACCEPT})
    assert served.status_code == 200, served.text


async def test_a_huge_epoch_is_not_read_and_the_records_it_says_were_lost_are_written_again(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with visited(redis, prefix, tmp_path) as (cluster, http):
        first = cluster.endpoint(0)
        held = await opened(http, first)
        peak = Peak(cluster.processes[0].pid)
        async with aioredis.Redis.from_url(redis.url) as peer:  # the store's data lost, its epoch huge
            await peer.delete(f"{prefix}:session:{held['Mcp-Session-Id']}")
            await peer.set(f"{prefix}:epoch", b"x" * HUGE)
            with anyio.fail_after(BOUND):  # each replica looks at the epoch every 2 s
                while not await peer.exists(f"{prefix}:session:{held['Mcp-Session-Id']}"):
                    await anyio.sleep(0.05)
        peak.check()
        served = await http.post(first, json=VISIT, headers={**held, **ACCEPT})
    assert served.status_code == 200, served.text


async def test_subscriptions_longer_than_any_uri_are_not_claimed_and_the_rest_are(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with visited(redis, prefix, tmp_path) as (cluster, http):
        first = cluster.endpoint(0)
        held = await opened(http, first)
        record = f"{prefix}:session:{held['Mcp-Session-Id']}"
        async with aioredis.Redis.from_url(redis.url) as peer:
            # What a compromised peer could write: subscriptions no replica holds, two of them
            # of URIs no client can subscribe to, and one a client could (unknown upstream).
            huge = {f"sub:{n}".encode() + b"x" * HUGE: b"" for n in range(2)}
            await peer.hset(record, mapping={**huge, b"sub:nowhere://1": b""})  # pyright: ignore[reportArgumentType]
            peak = Peak(cluster.processes[0].pid)
            # Its notification stream opened: the replica claims what no replica holds, tries
            # each, and drops what it cannot take (the unknown one).
            async with http.stream("GET", first, headers={**held, "Accept": "text/event-stream"}):
                with anyio.fail_after(BOUND):
                    while await peer.hexists(record, "sub:nowhere://1"):  # pyright: ignore[reportGeneralTypeIssues]
                        await anyio.sleep(0.05)
            peak.check()
            left = await peer.hmget(record, list(huge))  # pyright: ignore[reportGeneralTypeIssues]
        served = await http.post(first, json=VISIT, headers={**held, **ACCEPT})
    assert served.status_code == 200, served.text
    assert left == [b"", b""]  # the long ones left as they were: no holder named


async def test_a_clients_count_holding_huge_members_is_read_without_them_at_its_cap(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with capped(redis, prefix, tmp_path) as (cluster, http, sessions):
        async with aioredis.Redis.from_url(redis.url) as peer:
            count = f"{prefix}:{COUNT}"
            assert await peer.zcard(count) == 3  # pyright: ignore[reportGeneralTypeIssues]
            expiry = time.time() + 3600  # counted, not yet expired, the client's oldest but for them
            await peer.zadd(count, {f"{n}".encode() + b"x" * HUGE: expiry for n in range(2)})  # pyright: ignore[reportArgumentType]
        pids = [process.pid for process in cluster.processes]
        peaks = [Peak(pid) for pid in pids]
        newcomer = await http.post(cluster.endpoint(0), json=HELLO, headers=ACCEPT)  # at its cap: room made
        for peak in peaks:
            peak.check()
        served = [await status(http, cluster.endpoint(0), h) for h in sessions]
    assert newcomer.status_code in (200, 429), newcomer.text
    assert 200 in served  # the client's sessions not ended for it are served on
