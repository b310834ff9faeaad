"""The bounds of resource subscriptions: how many one session holds (``check_room``), and how
they are left upstream. A session's end leaves its subscriptions a few at a time within a
bound (``each_bounded``); a subscription its client dropped through another replica is left
by a task of its own (``Leaving``): the replicas' channel, which tells of it, waits for no
upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from agent_gateway.config import ClientPolicy
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.errors import ClientLimited, GatewayError, describe, to_wire
from agent_gateway.refusals import refused

logger = logging.getLogger(__name__)

_DEFAULT_LIMIT = ClientPolicy().max_subscriptions

RELEASE_TIMEOUT = 3.0
"""Seconds a session's end spends unsubscribing upstream (within the session end's own
bound, which releases its dedicated upstream sessions after)."""
RELEASE_CONCURRENCY = 16
"""Unsubscribes (and clients told of a lost subscription) sent at once."""
_QUEUED = 1024
"""Subscriptions waiting to be left upstream by ``Leaving``; past that, one is left to its
upstream session's end (updates for it reach nobody meanwhile)."""

Leave = Callable[[], Awaitable[None]]


class Leaving:
    """Upstream unsubscribes for callers that must not wait, sent one after another."""

    def __init__(self) -> None:
        self._send: MemoryObjectSendStream[Leave] | None = None

    def put(self, leave: Leave) -> bool:
        """Queue one (False: the queue is full, or not served: before ``run``, or after)."""
        if self._send is None:
            return False
        try:
            self._send.send_nowait(leave)
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Leave each queued subscription (each bounded by its own send timeout) until cancelled."""
        self._send, receive = anyio.create_memory_object_stream[Leave](_QUEUED)
        task_status.started()
        async with self._send, receive:
            async for leave in receive:
                try:
                    await leave()
                except GatewayError as exc:  # the upstream may be gone: nothing left to undo
                    logger.info("a subscription dropped elsewhere not left upstream: %s", describe(exc))


async def each_bounded(calls: Sequence[Callable[[], Awaitable[None]]]) -> tuple[int, str]:
    """Make ``calls``, ``RELEASE_CONCURRENCY`` at a time, for at most ``RELEASE_TIMEOUT``: how
    many did not succeed by then, and why the first that failed did (`` (why)``, or "")."""
    queue = iter(calls)
    done = 0
    failed: list[str] = []

    async def worker() -> None:
        nonlocal done
        for call in queue:  # shared: each call is taken by one worker
            try:
                await call()
                done += 1
            except GatewayError as exc:  # one upstream (or the store) failing stops no other
                failed.append(describe(exc))

    with anyio.move_on_after(RELEASE_TIMEOUT):
        async with anyio.create_task_group() as tg:
            for _ in range(min(RELEASE_CONCURRENCY, len(calls))):
                tg.start_soon(worker)
    return len(calls) - done, f" ({failed[0]})" if failed else ""


def check_room(session: DownstreamSession, wanted: int) -> None:
    """Refuses ``wanted`` subscriptions in ``session`` (those it holds and is making, and
    one more; or those a listen stream names) past its client's ``max_subscriptions``.

    Raises:
        MCPError: the bound, as a ``client limit`` error naming it.
    """
    limit = session.client.policy.max_subscriptions if session.client is not None else _DEFAULT_LIMIT
    if wanted <= limit:
        return
    label = session.client.label if session.client is not None else "(none)"
    refused(
        "subscriptions",
        "client %s refused %d subscriptions in a session (max %d)",
        label,
        wanted,
        limit,
        peer=label,
    )
    where = "one listen stream" if session.modern else "one session"
    raise to_wire(
        ClientLimited(f"{wanted} resource subscriptions in {where}; the limit (max_subscriptions) is {limit}")
    )
