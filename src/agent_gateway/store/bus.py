"""Announcements between replicas (Redis pub/sub): a session ended, an upstream's list changed.

Each replica listens on the channels it has handlers for and publishes what the others must
act on. Pub/sub delivers to whoever listens now: a replica that was cut off meanwhile has
missed what was said, which is why each announcement only speeds up what happens anyway (a
session's record is gone whether or not its end was heard; a catalog is refreshed on its own
upstream's notice too).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import anyio
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from agent_gateway.store.client import SharedStore

logger = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[None]]
_RETRY = 1.0
_HANDLER_TIMEOUT = 10.0


class Bus:
    """Publishes to, and listens on, the replicas' channels."""

    def __init__(self, store: SharedStore, channels: tuple[str, ...]) -> None:
        self.store = store
        self._channels = [store.key(c) for c in channels]
        self._handlers: dict[str, Handler] = {}

    def on(self, channel: str, handler: Handler) -> None:
        """Call ``handler`` with each message on ``channel`` (one of the bus's channels; a
        message that comes before a handler is set is dropped)."""
        self._handlers[self.store.key(channel)] = handler

    async def publish(self, channel: str, message: str) -> int | None:
        """Say ``message`` on ``channel``: how many replicas heard it, or None when the store
        failed (logged and watched by the store)."""
        heard = await self.store.call(self.store.redis.publish(self.store.key(channel), message), "publish")
        return None if heard is None else int(heard)

    async def listen(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Dispatch messages for ever, resubscribing after the store comes back."""
        started = False
        while True:
            pubsub = self.store.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._channels)  # pyright: ignore[reportUnknownMemberType]
                if not started:
                    started = True
                    task_status.started()
                await self._dispatch(pubsub, self._handlers)
            except (RedisError, OSError) as exc:
                logger.warning(
                    "replica channels: lost the shared store (%s); listening again in %ss", exc, _RETRY
                )
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.store.config.timeout):
                    await pubsub.aclose()
            if not started:
                started = True
                task_status.started()  # start-up goes on; the store watcher reports the outage
            await anyio.sleep(_RETRY)

    @staticmethod
    async def _dispatch(pubsub: PubSub, handlers: Mapping[str, Handler]) -> None:
        async for message in pubsub.listen():  # pyright: ignore[reportUnknownVariableType]
            channel = message["channel"].decode()  # pyright: ignore[reportUnknownMemberType]
            handler = handlers.get(channel)
            if handler is None:
                continue
            data: bytes = message["data"]  # pyright: ignore[reportUnknownVariableType]
            with anyio.move_on_after(_HANDLER_TIMEOUT):
                try:
                    await handler(data.decode())
                except Exception:  # one bad announcement must not stop the others
                    logger.exception("replica channels: handling a message on %s failed", channel)
