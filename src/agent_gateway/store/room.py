"""Room for a client's new session at its ``max_sessions`` counted across replicas: its session
touched the longest ago that no replica is serving ends for the new one.

Without a store, ``downstream/room.py`` ends the client's own session idle the longest on the
one replica. With one, a client's sessions are counted in the store and held by any replica
(opened on one, adopted by the others its requests reach through the balancer), and a session
idle here may have a request in flight or its stream open on another. So the replica asks them
all: it names the client's sessions touched the longest ago (the count's order: each is scored
by its last touch, on any replica) on the ``make-way`` channel, and each replica answers, on a
list of that question's own, which of them it serves now. The first that none serves ends as a
DELETE ends it (its record, its event streams, its place in the count; announced, so every
replica holding it drops it). A replica that does not answer in time may serve any of them:
none ends, and the client is refused as before. Before, the client was refused until its
sessions' idle timeout (30 min): a client that reconnects without a DELETE (many do) locked
itself out, on every replica, as it did on one before ``downstream/room.py``.

A request that reaches a session between its replica's answer and the end fails with it: the
window is a round trip, and the session was the one its client had used the longest ago.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agent_gateway.access import Principal
from agent_gateway.store.bus import Bus
from agent_gateway.store.sessions import SessionRecords

if TYPE_CHECKING:
    from agent_gateway.store.client import SharedStore

MAKE_WAY = "make-way"
"""The channel of the question: ``<question id> <session id>...``."""
_CANDIDATES = 16
"""The client's sessions named in one question, those touched the longest ago."""
_WAIT = 1.0
"""Seconds for every replica's answer (a round trip each; at most half the store's timeout)."""
_ANSWER_KEPT = 10
"""Seconds an answer is kept for a question given up on (a replica answering late)."""
_MEMBER_LONGEST = 64
"""Bytes of a member of a client's count read: a session id is 32 (``opening:`` and 32 while
it opens); a longer one was written by something else, and is never read."""
# KEYS: the client's count. ARGV: how many, the longest member. Its members touched the longest
# ago, those no longer than that (two of 32 MiB, read whole and named on the channel, held every
# replica's memory at the client's next ``initialize``).
_OLDEST = """
local found, longest = {}, tonumber(ARGV[2])
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  if #member <= longest then
    found[#found + 1] = member
  end
end
return found
"""

Serving = Callable[[Sequence[str]], list[str]]


def _none(_: Sequence[str]) -> list[str]:
    return []


class SharedRoom:
    """Ends a client's session no replica serves, for its new one; answers the others' questions."""

    def __init__(self, store: SharedStore, bus: Bus, records: SessionRecords) -> None:
        self._store = store
        self._bus = bus
        self._records = records
        self.serving: Serving = _none
        """Which of the sessions named this replica serves now (``downstream/room.py``, once
        the HTTP app is built; a replica serving none answers none)."""
        self._oldest = store.redis.register_script(_OLDEST)
        self._making: set[str] = set()
        """Clients (labels) whose room is being made here: one question at a time each."""
        bus.on(MAKE_WAY, self.answer)

    async def make(self, client: Principal) -> str | None:
        """End ``client``'s session touched the longest ago that no replica serves: its id; None
        when each is served, a replica did not answer, or a question of its is under way."""
        if client.label in self._making:
            return None
        self._making.add(client.label)
        try:
            candidates = await self._candidates(client)
            served = await self._ask(candidates) if candidates else None
            if served is None:
                return None
            ended = next((s for s in candidates if s not in served), None)
            if ended is not None:
                await self._records.ended(ended)
                # Out of the count even when its record was gone (which the end reads it from).
                key = self._store.key("sessions", client.label)
                await self._store.call(self._store.redis.zrem(key, ended), "make_way")  # pyright: ignore[reportUnknownMemberType]
            return ended
        finally:
            self._making.discard(client.label)

    async def answer(self, message: str) -> None:
        """Say which of the sessions a question names this replica serves now."""
        question, *session_ids = message.split()
        key = self._store.key(MAKE_WAY, question)
        pipe = self._store.redis.pipeline(transaction=False)
        pipe.rpush(key, " ".join(self.serving(session_ids[:_CANDIDATES])))  # pyright: ignore[reportUnknownMemberType]
        pipe.expire(key, _ANSWER_KEPT)
        await self._store.call(pipe.execute(), "make_way_answer")

    async def _candidates(self, client: Principal) -> list[str]:
        """The client's counted sessions, touched the longest ago first (not the places held
        for sessions being opened)."""
        key = self._store.key("sessions", client.label)
        members: list[bytes] | None = await self._store.call(
            self._oldest(keys=[key], args=[2 * _CANDIDATES, _MEMBER_LONGEST]), "make_way"
        )
        found = [m.decode() for m in members or () if not m.startswith(b"opening:")]
        return found[:_CANDIDATES]

    async def _ask(self, session_ids: list[str]) -> set[str] | None:
        """The sessions of ``session_ids`` some replica serves; None: not every replica answered."""
        question = uuid.uuid4().hex
        heard = await self._bus.publish(MAKE_WAY, f"{question} {' '.join(session_ids)}")
        if not heard:
            return None
        key = self._store.key(MAKE_WAY, question)
        deadline = time.monotonic() + min(_WAIT, self._store.config.timeout / 2)
        served: set[str] = set()
        for _ in range(heard):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # Whole milliseconds: Redis reads the timeout as a decimal number of seconds.
            wait = math.ceil(left * 1000) / 1000
            answer = await self._store.call(self._store.redis.blpop([key], timeout=wait), "make_way")  # pyright: ignore[reportUnknownMemberType]
            if answer is None:
                return None
            served.update(answer[1].decode().split())
        return served
