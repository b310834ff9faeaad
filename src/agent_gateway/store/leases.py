"""One holder at a time across replicas: a lease in Redis, for the ``ask_agent`` runs of one
conversation (with ``agent.memory.store: postgres`` every replica reads and writes the same
thread, and two runs at once would each write a history without the other's turn).

A lease is a key set only if absent (``SET NX PX``) to a token of its holder, renewed while
it is held and deleted on release only by that holder (compare and delete, one script), so a
holder that died frees it after ``ttl`` and never frees another's. A waiting replica polls:
waits are rare (one conversation, two replicas, the same moment) and a poll is one round
trip. While the store is unreachable a lease is not taken (each replica's own lock still
holds its runs to one at a time), as limits fall back to each replica's own counts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from agent_gateway.store.client import SharedStore


logger = logging.getLogger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Leases:
    """Named leases on the shared store."""

    def __init__(self, store: SharedStore, ttl: float = 30.0, poll: float = 0.2) -> None:
        self.store = store
        self._ttl_ms = int(ttl * 1000)
        self._poll = poll
        self._renew = store.redis.register_script(_RENEW)
        self._release = store.redis.register_script(_RELEASE)

    @asynccontextmanager
    async def held(self, name: str, deadline: float = math.inf) -> AsyncIterator[None]:
        """Wait until ``name`` is free on every replica, hold it until exit (renewed meanwhile).

        Raises:
            TimeoutError: another replica still held it at ``deadline`` (``anyio.current_time``);
                the wait is bounded here, not by a scope around the holder, which would have
                to end before the task renewing the lease does.
        """
        key = self._key(name)
        token = uuid.uuid4().hex
        taken = False
        with anyio.CancelScope(deadline=deadline) as waiting:
            taken = await self._take(key, token)
        if waiting.cancelled_caught:
            raise TimeoutError(f"lease {key} still held on another replica")
        async with anyio.create_task_group() as tg:
            if taken:
                tg.start_soon(self._keep, key, token)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                if taken:
                    await self._let_go(key, token)

    @asynccontextmanager
    async def vacant(self, name: str) -> AsyncIterator[bool]:
        """Hold ``name`` until exit if no replica holds it now, without waiting; yields whether
        it is held (False: another replica holds it, or the store is unreachable and no one
        can tell). For short work only: the lease is not renewed."""
        key, token = self._key(name), uuid.uuid4().hex
        set_now = await self._set(key, token)
        try:
            yield bool(set_now)
        finally:
            if set_now:
                await self._let_go(key, token)

    def _key(self, name: str) -> str:
        return self.store.key("lease", hashlib.sha256(name.encode()).hexdigest()[:32])

    async def _take(self, key: str, token: str) -> bool:
        """Whether the lease was taken (False: the store is unreachable, so none is)."""
        waiting = False
        while True:
            set_now = await self._set(key, token)
            if set_now:
                return True
            if not self.store.available:
                logger.warning("lease %s not taken: the shared store is unreachable", key)
                return False
            if not waiting:
                waiting = True
                logger.info("lease %s is held on another replica: waiting for it", key)
            await anyio.sleep(self._poll)

    async def _set(self, key: str, token: str) -> object:
        """``SET NX PX``'s answer (None: the store failed). Cancelled on its way (a run's
        deadline in its wait, a client gone), a SET Redis may have run is undone: before, its
        key stayed set, renewed by no one and released by no one, and the conversation was
        held on every replica for the lease's ``ttl``."""
        try:
            return await self.store.call(self.store.redis.set(key, token, nx=True, px=self._ttl_ms), "lease")
        except anyio.get_cancelled_exc_class():
            await self._let_go(key, token)
            raise

    async def _let_go(self, key: str, token: str) -> None:
        """Delete ``key`` if ``token`` still holds it; shielded (a cancelled holder's too), and
        bounded by the store's timeout."""
        with anyio.CancelScope(shield=True):
            await self.store.call(self._release(keys=[key], args=[token]), "lease_release")

    async def _keep(self, key: str, token: str) -> None:
        while True:
            await anyio.sleep(self._ttl_ms / 3000)
            await self.store.call(self._renew(keys=[key], args=[token, self._ttl_ms]), "lease_renew")
