"""Redis paused for writes (``CLIENT PAUSE WRITE``, as a failover pauses its primary): it still
answers a PING, and holds every script a request runs."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx
import redis.asyncio as aioredis

from tests.replicas.cluster import replicas
from tests.replicas.services import redis_server
from tests.replicas.test_sessions import BOUND, TOKEN_ENV, bearer, config, counter_server, session_to, text_of
from tests.support import serving_upstream

PAUSED = 5.0
"""Seconds of calls while Redis takes no writes: several of the watcher's looks."""


async def test_a_store_paused_for_writes_is_taken_as_down_until_it_takes_writes_again(
    prefix: str, tmp_path: Path
) -> None:
    # Bob's rate limit has each of his calls ask the store while it is taken as available.
    limited = {"rate_limit": {"per_minute": 60_000, "burst": 1_000}}
    with redis_server() as redis:
        async with serving_upstream(counter_server([])) as upstream:
            data = config(redis, prefix, upstream, auth=bearer(bob=limited))
            data["store"]["timeout"] = 1
            async with (
                replicas(data, tmp_path, count=1, env=TOKEN_ENV) as cluster,
                session_to(cluster.endpoint(0), "bob") as (client, _),
                aioredis.Redis.from_url(redis.url) as still,
                httpx.AsyncClient() as http,
            ):
                await client.call_tool("counter__echo", {"text": "before"})
                await still.client_pause(60_000, all=False)
                answered, start = 0, time.monotonic()
                while time.monotonic() - start < PAUSED:
                    answered += text_of(await client.call_tool("counter__echo", {"text": "y"})) == "y"
                await still.client_unpause()
                with anyio.fail_after(BOUND):
                    while (await http.get(cluster.replicas[0] + "/readyz")).status_code != 200:
                        await anyio.sleep(0.1)
    log = cluster.log(0)
    assert answered > 1
    # Taken as down once, by the first call held, and up only once it took writes again: while
    # PINGed, it came back up each second and the next call waited out the timeout again.
    assert log.count("unavailable (") == 1, log
    assert log.count("answers again") == 1
