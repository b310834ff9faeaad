"""A client at its ``max_sessions`` counted across replicas gets its next session by ending its
session touched the longest ago that no replica serves (``store/room.py``). Before, with a
store, it was refused until its sessions' idle timeout: a client that reconnects without a
DELETE locked itself out of every replica for 30 minutes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx

from tests.replicas.cluster import Cluster
from tests.replicas.services import Redis
from tests.replicas.test_sessions import BOUND, cluster_of
from tests.replicas.test_shared_counts import raw_client
from tests.replicas.test_store import ACCEPT, HELLO, VERSION, events, opened

PING = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
CAPPED = {"mode": "none", "policies": {"default": {"max_sessions": 3}}}
COUNT = "sessions:anonymous@127.0.0.1"


async def status(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int:
    return (await http.post(url, json=PING, headers={**headers, **ACCEPT})).status_code


@asynccontextmanager
async def capped(
    redis: Redis, prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, httpx.AsyncClient, list[dict[str, str]]]]:
    """Two replicas, a client capped at 3 sessions, and its 3 opened on replicas 0, 1, 0."""
    async with (
        cluster_of(redis, prefix, tmp_path, [], auth=CAPPED) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        yield cluster, http, [await opened(http, cluster.endpoint(n % 2)) for n in range(3)]


async def gone(http: httpx.AsyncClient, at: Callable[[int], str], headers: dict[str, str]) -> None:
    """Wait until neither replica serves the session any more."""
    with anyio.fail_after(BOUND):
        while [await status(http, at(n), headers) for n in (0, 1)] != [404, 404]:
            await anyio.sleep(0.02)


async def test_at_its_cap_across_replicas_a_client_ends_its_session_touched_the_longest_ago(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with capped(redis, prefix, tmp_path) as (cluster, http, (first, second, third)):
        at = cluster.endpoint
        assert await status(http, at(1), first) == 200  # touched again, on the other replica
        newest = await opened(http, at(0))  # at the cap: "second" ends for it
        await gone(http, at, second)
        kept = [await status(http, at(n), h) for n in (0, 1) for h in (first, third, newest)]
        async with raw_client(redis) as raw:
            counted: list[bytes] = await raw.zrange(f"{prefix}:{COUNT}", 0, -1)  # pyright: ignore[reportAssignmentType]
            record = await raw.exists(f"{prefix}:session:{second['Mcp-Session-Id']}")
        log = cluster.log(0)
    assert kept == [200] * 6
    assert sorted(m.decode() for m in counted) == sorted(h["Mcp-Session-Id"] for h in (first, third, newest))
    assert record == 0
    assert "touched the longest ago, served by no replica" in log


async def test_a_session_served_by_another_replica_never_ends_for_a_new_one(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with capped(redis, prefix, tmp_path) as (cluster, http, (first, second, third)):
        at = cluster.endpoint
        # "first" is touched the longest ago and idle on replica 0, which opened it; its stream
        # is open on replica 1: served there, it is not the one that ends.
        async with events(http, at(1), first):
            newest = await opened(http, at(0))
            await gone(http, at, second)
            kept = [await status(http, at(n), h) for n in (0, 1) for h in (first, third, newest)]
            # Each served now (its stream open on one replica): none ends, the client is refused.
            async with events(http, at(0), third), events(http, at(1), newest):
                refused = await http.post(at(0), json=PING | {"method": "initialize"}, headers=ACCEPT)
    assert kept == [200] * 6
    assert refused.status_code == 429, refused.text
    assert "sessions open" in refused.text


async def test_a_session_is_counted_once_as_its_answer_starts_so_the_next_one_ends_none(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # Counted as open only after its ``initialize`` answer had gone out, a session stayed
    # counted twice (open, and its opening's place) while its client went on: the client's
    # next session found one too many and ended its own oldest (failed once in CI, the race
    # a round trip wide). A long answer its client does not read holds that window open.
    wordy = {"instructions": "Read this first. " + "x" * 8 * 2**20}
    async with (
        cluster_of(redis, prefix, tmp_path, [], auth=CAPPED, server=wordy) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        at = cluster.endpoint
        first = await opened(http, at(0))
        async with http.stream("POST", at(1), json=HELLO, headers=ACCEPT) as unread:
            second = {"Mcp-Session-Id": unread.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
            used = await status(http, at(1), second)
            newest = await opened(http, at(0))
            kept = [await status(http, at(n), h) for n in (0, 1) for h in (first, second, newest)]
        async with raw_client(redis) as raw:
            counted: list[bytes] = await raw.zrange(f"{prefix}:{COUNT}", 0, -1)  # pyright: ignore[reportAssignmentType]
        log = cluster.log(0)
    assert (used, kept) == (200, [200] * 6)
    assert sorted(m.decode() for m in counted) == sorted(h["Mcp-Session-Id"] for h in (first, second, newest))
    assert "to make way" not in log


async def test_a_replica_that_does_not_answer_may_serve_any_session_so_none_ends(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # A third listener on the replicas' channel (a replica cut off, or stalled) that hears the
    # question and never answers: the replicas cannot know it serves none of the sessions.
    # Without it first (one session ends for the new one), then with it (none ends): one
    # cluster for both (each was a test of its own, two replicas started for each).
    async with (
        capped(redis, prefix, tmp_path) as (cluster, http, held),
        raw_client(redis) as raw,
        raw.pubsub() as silent,
    ):
        at = cluster.endpoint
        answer = await http.post(at(0), json=PING | {"method": "initialize"}, headers=ACCEPT)
        made_way = [await status(http, at(0), h) for h in held]
        newest = {"Mcp-Session-Id": answer.headers.get("mcp-session-id", ""), "Mcp-Protocol-Version": VERSION}
        held = [h for h, code in zip(held, made_way, strict=True) if code == 200] + [newest]
        await silent.subscribe(f"{prefix}:make-way")
        refused = await http.post(at(0), json=PING | {"method": "initialize"}, headers=ACCEPT)
        kept = [await status(http, at(0), h) for h in held]
    assert answer.status_code == 200, answer.text
    assert made_way.count(404) == 1
    assert refused.status_code == 429, refused.text
    assert kept == [200] * 3
