"""Leases on a real Redis (``store/leases.py``): one holder at a time, a dead holder's lease
freed after its time, and no lease (never a wait without end) while Redis is unreachable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from agent_gateway.config_store import StoreConfig
from agent_gateway.store.client import SharedStore
from agent_gateway.store.leases import Leases
from tests.replicas.services import Redis, redis_server

BOUND = 10.0


@asynccontextmanager
async def store_on(redis: Redis, prefix: str) -> AsyncIterator[SharedStore]:
    store = SharedStore(StoreConfig(url=redis.url, prefix=prefix, timeout=0.5))
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def test_a_lease_has_one_holder_at_a_time(redis: Redis, prefix: str) -> None:
    order: list[str] = []
    async with store_on(redis, prefix) as one, store_on(redis, prefix) as other:
        first, second = Leases(one, ttl=5), Leases(other, ttl=5, poll=0.02)
        taken = anyio.Event()

        async def hold_first() -> None:
            async with first.held("trip"):
                taken.set()
                order.append("first in")
                await anyio.sleep(0.3)
                order.append("first out")

        async def hold_second() -> None:
            await taken.wait()
            async with second.held("trip"):
                order.append("second in")
            async with second.held("another"):
                order.append("another")

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_first)
                tg.start_soon(hold_second)
    assert order == ["first in", "first out", "second in", "another"]


async def test_a_lease_whose_holder_died_is_free_after_its_time(redis: Redis, prefix: str) -> None:
    async with store_on(redis, prefix) as store:
        dead = Leases(store, ttl=0.5)
        # Taken and never renewed nor released, as by a replica killed while holding it.
        key = store.key("lease", "orphan")
        assert await store.redis.set(key, "dead-holder", nx=True, px=500)
        assert await dead._take(key, "new-holder")  # pyright: ignore[reportPrivateUsage]
        assert await store.redis.get(key) == b"new-holder"


async def test_no_lease_is_waited_for_while_redis_is_unreachable(prefix: str) -> None:
    with redis_server() as redis:
        async with store_on(redis, prefix) as store:
            leases = Leases(store)
            async with leases.held("trip"):
                redis.stop()
                with anyio.fail_after(BOUND):
                    async with leases.held("trip"):  # its holder's key unreadable: not waited for
                        pass
            assert not store.available
