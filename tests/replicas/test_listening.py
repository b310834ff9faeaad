"""A session a replica adopted by its notification stream alone (its client sent that replica
no request yet) is served there as one a request adopted: the replica takes over the
session's subscriptions that no replica holds, and writes its record again, as it is, when
the store lost it. A client that subscribed and then only listens is the common case, and
its stream is what moves to a surviving replica when the one it used dies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis

from agent_gateway.store.holders import HEARTBEAT_TTL
from tests.replicas.services import Redis, redis_server
from tests.replicas.test_restore import counted, recorded, recorder_replicas, request
from tests.replicas.test_sessions import BOUND
from tests.replicas.test_store import (
    ACCEPT,
    BUMP,
    SUBSCRIBE,
    UPDATED,
    events,
    next_message,
    opened,
    recorder_cluster,
)


async def test_a_stream_alone_takes_over_the_subscriptions_of_a_replica_that_dies(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    async with recorder_cluster(redis, prefix, tmp_path, seen) as session:
        await session.post(0, SUBSCRIBE)  # held by replica 0
        async with session.events(1) as reader:  # replica 1 adopts the session by it alone
            session.cluster.kill(0)
            with anyio.fail_after(HEARTBEAT_TTL + 3 * BOUND / 4):
                _, told = await reader.__anext__()
            await session.post(1, BUMP)  # an update the upstream sends replica 1 now reaches it
            _, updated = await next_message(reader)
    assert told == UPDATED  # "it may have changed while nobody relayed its updates"
    assert updated == UPDATED
    assert [e["uri"] for e in seen if e["event"] == "subscribe"] == ["counter://value"] * 2
    assert "subscription to counter://value taken over" in session.cluster.log(1)


async def test_a_record_lost_is_written_again_by_the_replica_holding_only_its_stream(
    prefix: str, tmp_path: Path
) -> None:
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
