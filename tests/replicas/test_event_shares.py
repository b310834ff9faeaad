"""What one client's streams put in the shared store: each replica keeps at most its
``store.events.per_client`` bytes of a client's events within their ttl (unbounded, one
client's streamed answers put 176 MB in Redis in 10 s through one replica, each kept 5
minutes), and another client's events are kept all the same."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
import redis.asyncio as aioredis
from fastmcp import Context, FastMCP
from mcp.server.streamable_http import GET_STREAM_KEY

from agent_gateway.store import events
from agent_gateway.store.events import LIVE, Entry, stream_digest
from tests.replicas.cluster import replicas
from tests.replicas.services import Redis
from tests.replicas.test_event_bounds import event_store, note
from tests.replicas.test_sessions import BOUND, TOKEN_ENV, TOKENS, bearer, config
from tests.replicas.test_store import ACCEPT, opened
from tests.support import serving_upstream

SHARE = 2**20
PART = 150_000
"""Characters of each progress message and of the answer of one call: ~600 KB of events."""


def reporting_server() -> FastMCP:
    server = FastMCP("big")

    @server.tool
    async def big(n: int, ctx: Context) -> str:
        """Report progress three times, n characters each, then answer n characters."""
        for i in range(3):
            await ctx.report_progress(i + 1, 4, "p" * n)
        return "y" * n

    return server


async def streamed(http: httpx.AsyncClient, url: str, headers: dict[str, str], n: int) -> str:
    """A call answered as a stream (it reports progress); its stream's key in Redis."""
    call = {
        "jsonrpc": "2.0", "id": n, "method": "tools/call",
        "params": {"name": "big__big", "arguments": {"n": PART}, "_meta": {"progressToken": n}},
    }  # fmt: skip
    async with http.stream("POST", url, json=call, headers=headers) as answer:
        ids = [line[3:].strip() async for line in answer.aiter_lines() if line.startswith("id:")]
    assert len(ids) == 4, ids
    return ids[0].partition("/")[2]


async def kept(raw: aioredis.Redis, prefix: str, digest: str) -> list[bytes]:
    entries: list[Entry] = await raw.xrange(f"{prefix}:events:{digest}")  # pyright: ignore[reportAssignmentType]
    return [fields.get(b"m", b"") for _, fields in entries]


async def test_a_clients_stream_events_past_its_share_are_not_kept_and_anothers_are(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with serving_upstream(reporting_server()) as upstream:
        data = config(redis, prefix, upstream, auth=bearer())
        data["upstreams"] = {"big": {"url": upstream}}
        data["store"]["events"] = {"per_client": SHARE}
        async with (
            replicas(data, tmp_path, count=1, env=TOKEN_ENV) as cluster,
            httpx.AsyncClient(timeout=BOUND) as http,
            aioredis.Redis.from_url(redis.url) as raw,
        ):
            url = cluster.endpoint(0)
            alice, bob = ({**ACCEPT, "Authorization": f"Bearer {TOKENS[n]}"} for n in ("alice", "bob"))
            alice |= await opened(http, url, alice)
            bob |= await opened(http, url, bob)
            hers = [await streamed(http, url, alice, n) for n in range(1, 5)]
            his = await streamed(http, url, bob, 9)
            with anyio.fail_after(BOUND):  # written behind, in order: hers before his
                while not any(b'"result"' in m for m in await kept(raw, prefix, his)):
                    await anyio.sleep(0.05)
            held = sum([len(m) for digest in hers for m in await kept(raw, prefix, digest)])
    assert held <= SHARE + PART + 1_000  # the share, overrun by one event at most; 2.4 MB before
    assert "stream events past 1048576 bytes" in cluster.log(0)


async def test_a_notification_past_its_clients_share_is_still_relayed_though_not_kept(
    redis: Redis, prefix: str
) -> None:
    # The replica holding the session's notification stream may be another: it hears the
    # event on the channel only, and must, whatever the share says of keeping it.
    listening = f"3:abc:{GET_STREAM_KEY}"
    async with event_store(redis, prefix, per_client=SHARE) as (shared, raw), raw.pubsub() as live:
        shared.client_of = lambda _: "alice"
        await live.subscribe(f"{prefix}:{LIVE}")
        for _ in range(2):  # her share spent on a call's stream
            await shared.store_event("3:abc:request-1", note(600_000))
        event_id = await shared.store_event(listening, note(10))
        with anyio.fail_after(BOUND):
            while (heard := await live.get_message(ignore_subscribe_messages=True, timeout=1)) is None:
                pass
        assert heard["data"].startswith(event_id.encode() + b"\n")
        assert await raw.xlen(f"{prefix}:events:{stream_digest(listening)}") == 0


async def test_past_the_shares_kept_newcomers_share_one(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "_SHARES_KEPT", 2)  # each is a budget a replica keeps
    dave = f"4:dave:{GET_STREAM_KEY}"
    async with event_store(redis, prefix, per_client=SHARE) as (shared, raw), raw.pubsub() as live:
        shared.client_of = lambda session: session
        await live.subscribe(f"{prefix}:{LIVE}")
        for stream in ("5:alice:request-1", "3:bob:request-1", "5:carol:request-1"):
            for _ in range(2):  # each spends its share; carol the one newcomers share
                await shared.store_event(stream, note(600_000))
        event_id = await shared.store_event(dave, note(10))  # published still, written last
        with anyio.fail_after(BOUND):
            while (heard := await live.get_message(ignore_subscribe_messages=True, timeout=1)) is None:
                pass
        assert heard["data"].startswith(event_id.encode())
        assert await raw.xlen(f"{prefix}:events:{stream_digest('5:carol:request-1')}") == 2
        assert await raw.xlen(f"{prefix}:events:{stream_digest(dave)}") == 0


async def test_events_of_no_size_spend_a_share_too(redis: Redis, prefix: str) -> None:
    # A streamed call opens its stream with an empty priming event: counted by their bytes
    # alone, a client's tiny streams were kept without end, each a key in Redis.
    async with event_store(redis, prefix, per_client=SHARE) as (shared, raw):
        shared.client_of = lambda session: session
        for n in range(2 * SHARE // events._STREAM_COST):  # pyright: ignore[reportPrivateUsage]
            await shared.store_event(f"5:alice:request-{n}", None)
        await shared.store_event("3:bob:request-1", note(10))  # another's, kept, written last
        with anyio.fail_after(BOUND):
            while await raw.xlen(f"{prefix}:events:{stream_digest('3:bob:request-1')}") == 0:
                await anyio.sleep(0.05)
        kept = [key async for key in raw.scan_iter(f"{prefix}:events:*")]
    assert len(kept) <= SHARE // events._STREAM_COST + 2  # pyright: ignore[reportPrivateUsage]
