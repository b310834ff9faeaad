"""Leases on a real Redis (``store/leases.py``): one holder at a time, a dead holder's lease
freed after its time, and no lease (never a wait without end) while Redis is unreachable."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

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


async def test_a_wait_for_a_lease_past_its_deadline_raises_and_leaves_the_holders_lease(
    redis: Redis, prefix: str
) -> None:
    # A run's wait for its conversation ends at its run_timeout: a scope around the holder
    # ended before the task renewing the lease did ("Attempted to exit a cancel scope that
    # isn't the current task's"), and every run through a replica failed; the wait is now
    # bounded inside ``held``.
    async with store_on(redis, prefix) as one, store_on(redis, prefix) as other:
        first, second = Leases(one, ttl=5), Leases(other, ttl=5, poll=0.02)
        with anyio.fail_after(BOUND):
            async with first.held("trip"):
                with pytest.raises(TimeoutError, match="still held on another replica"):
                    async with second.held("trip", anyio.current_time() + 0.3):
                        raise AssertionError("taken while another holds it")
                async with second.vacant("trip") as free:
                    assert not free  # still the first's
            async with second.held("trip", anyio.current_time() + BOUND):
                pass  # free once the first is out, within the deadline


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


@asynccontextmanager
async def replies_held(redis: Redis) -> AsyncIterator[tuple[str, anyio.Event]]:
    """A relay to ``redis`` whose connections, once one sends a SET, pass on its commands but
    none of its replies: a SET Redis ran, its answer still on its way. Yields the relay's URL
    and an event set once such a SET has gone on to Redis."""
    sent = anyio.Event()

    async def relay(client: anyio.abc.SocketStream) -> None:
        muted = False

        async def down(server: anyio.abc.SocketStream) -> None:
            async for chunk in server:
                if not muted:
                    await client.send(chunk)

        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            server = await anyio.connect_tcp("127.0.0.1", redis.port)
            async with client, server, anyio.create_task_group() as tg:
                tg.start_soon(down, server)
                async for chunk in client:
                    await server.send(chunk)
                    if b"$3\r\nSET\r\n" in chunk:
                        muted = True
                        sent.set()
                tg.cancel_scope.cancel()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, relay)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        yield f"redis://127.0.0.1:{port}/0", sent
        tg.cancel_scope.cancel()


async def test_a_lease_whose_taking_is_cancelled_is_not_left_held(redis: Redis, prefix: str) -> None:
    async with replies_held(redis) as (url, sent), store_on(redis, prefix) as direct:
        relayed = SharedStore(StoreConfig(url=url, prefix=prefix, timeout=BOUND))
        await relayed.start()
        try:
            leases = Leases(relayed, ttl=60)
            with anyio.fail_after(BOUND), anyio.CancelScope() as deadline:  # a run's, in its wait
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        async with leases.held("trip"):
                            pass

                    tg.start_soon(take)
                    await sent.wait()  # Redis set the key; its answer is not back yet
                    deadline.cancel()
            assert relayed.available
        finally:
            await relayed.close()
        left = await direct.redis.get(leases._key("trip"))  # pyright: ignore[reportPrivateUsage]
    assert left is None  # else the conversation stayed held on every replica for 60 s, by no one
