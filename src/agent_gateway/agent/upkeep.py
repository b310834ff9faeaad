"""What conversation memory keeps, and who may touch a thread meanwhile.

Runs on one thread take turns (``lock``): two at once would interleave one conversation.
Threads leave the store two ways: unused for ``agent.memory.retention_days`` (``sweep``, now
and then), or past their client's ``max_threads`` (``make_room``, as a run starts one): with
no bound, one client starting runs with new conversation ids (or a modern client, each of
whose runs is a new thread) grew the store without end, its disk everyone's. A thread a run
holds is never deleted under it: each is re-checked under its lock, and a locked one skipped.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from functools import partial

import anyio

from agent_gateway.agent.memory import Conversations
from agent_gateway.errors import AgentError

logger = logging.getLogger(__name__)

_SWEEP_EVERY = 3600.0
Vacant = Callable[[str], AbstractAsyncContextManager[bool]]
"""Hold a thread (by name) on every replica if none holds it now; yields whether it is held."""
Exclusive = Callable[[str, float], AbstractAsyncContextManager[None]]
"""Hold a thread (by name) for one run, on every replica, waiting until a deadline at most
(``anyio.current_time``; ``TimeoutError`` past it)."""


@asynccontextmanager
async def _here_only(_: str) -> AsyncIterator[bool]:
    """One replica: its own lock per thread is all there is to hold."""
    yield True


@asynccontextmanager
async def _anywhere(_: str, __: float) -> AsyncIterator[None]:
    """One replica: its own lock per thread is all there is to hold."""
    yield


class Upkeep:
    """The run locks of one gateway's threads, and the deletions they guard."""

    def __init__(
        self, conversations: Conversations, vacant: Vacant | None = None, exclusive: Exclusive | None = None
    ) -> None:
        """``vacant``: a thread held across replicas (their memory shared), if no run holds it;
        ``exclusive``: the same for a run, waited for."""
        self._conversations = conversations
        self._vacant = vacant or _here_only
        self._exclusive = exclusive or _anywhere
        self._locks: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()

    def lock(self, thread: str) -> anyio.Lock:
        """The lock a run on ``thread`` holds throughout."""
        lock = self._locks.get(thread)
        if lock is None:
            lock = self._locks[thread] = anyio.Lock()
        return lock

    @asynccontextmanager
    async def held(self, thread: str, deadline: float, within: float) -> AsyncIterator[None]:
        """``thread`` held for one run (its lock here, and across replicas), waited for until
        ``deadline`` at most: the end of the run's ``within`` seconds. Runs queued on one
        conversation waited each for every one before it: the 50th of 50 runs that each took
        their ``agent.run_timeout`` answered after 50 of them.

        Raises:
            AgentError: the thread was still held at ``deadline``; this run never started.
        """
        lock = self.lock(thread)
        with anyio.CancelScope(deadline=deadline) as waiting:
            await lock.acquire()
        if waiting.cancelled_caught:
            raise _busy(within)
        try:
            async with AsyncExitStack() as stack:
                try:  # the lease's own wait is bounded: a scope here would end before its renewal's task
                    await stack.enter_async_context(self._exclusive(thread, deadline))
                except TimeoutError:
                    raise _busy(within) from None
                yield
        finally:
            lock.release()

    async def make_room(self, owner: str) -> None:
        """Delete ``owner``'s least recently used threads past its bound (not those in use)."""
        try:
            for thread in await self._conversations.crowded(owner):
                await self._delete_unless_held(thread, partial(self._conversations.evict, thread, owner))
        except Exception as exc:  # the run goes on; the next one tries again
            self._failed("a client's threads past its bound could not be deleted", exc)

    async def sweep(self) -> None:
        """Delete, now and then, the threads unused for longer than the retention; until cancelled."""
        retention = self._conversations.retention
        if retention is None:
            return
        while True:
            await anyio.sleep(min(retention / 10, _SWEEP_EVERY))
            try:
                for thread in await self._conversations.expired():
                    await self._delete_unless_held(thread, partial(self._conversations.forget, thread))
            except Exception as exc:  # the sweeper's top: a failing store must not end the gateway
                self._failed("expired threads could not be deleted", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        """Say ``what`` failed: in one line when the shared database is gone, else with the traceback."""
        if (why := self._conversations.lost(exc)) is not None:
            logger.warning("conversation memory: %s: %s", what, why)
        else:
            logger.exception("conversation memory: %s", what)

    async def _delete_unless_held(self, thread: str, delete: Callable[[], Awaitable[bool]]) -> None:
        """``delete`` (which re-checks, under the lock, that the thread is still to go) unless
        a run is on the thread: in use, it stays."""
        lock = self.lock(thread)
        if lock.locked():
            return
        # A run on another replica holds only the shared lease: deleted under that run, the
        # thread it went on writing was in no table of uses, so never expired nor counted.
        async with lock, self._vacant(thread) as held:
            if held:
                await delete()


def _busy(within: float) -> AgentError:
    return AgentError(
        f"the conversation was busy: another run on it held it for all of this run's {within:g}s "
        f"(agent.run_timeout), so this run never started; call again once it ends, or use "
        f"another conversation_id"
    )
