"""Which replica holds each resource subscription of a handshake-era session, so that a
replica that dies does not take its clients' subscriptions with it.

A subscription is held (subscribed upstream, its updates relayed) by the replica that took
it; its session's record names that replica (``sub:<uri>`` fields). A client that unsubscribes
through another replica has the field deleted, and the holder told (``DROPPED``): it leaves
the subscription upstream (before, it kept it, relaying updates the client had unsubscribed
from, and let it go as still wanted when its copy of the session ended, so the stream's
holder took it again). Every replica beats a
heartbeat key while it runs. A replica that holds a session's notification stream claims,
when the stream opens and every few seconds while it is open, the session's subscriptions
whose holder's heartbeat is gone, or that their holder let go of (its copy of the session
ended: a restart, its own idle timer), and subscribes to them itself. The claim is one
script, so two replicas never both take one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus

from agent_gateway.access import MAX_URI_LENGTH
from agent_gateway.store.bus import Bus
from agent_gateway.store.record import SUBSCRIPTION
from agent_gateway.store.sessions import SessionRecords

if TYPE_CHECKING:
    from agent_gateway.store.client import SharedStore

logger = logging.getLogger(__name__)

HEARTBEAT_TTL = 10
"""Seconds a replica's heartbeat outlives its last beat: a dead replica's subscriptions are
claimed after at most this (plus a claim interval)."""
_BEAT_EVERY = 3.0

DROPPED = "subscription-dropped"
"""The channel on which a replica tells another that a subscription it holds was dropped:
``<holder> <session id> <uri>``."""

# KEYS: the record. ARGV: the field, this replica, the channel, the session id. Deleted; its
# holder told when that is another replica.
_DROP = """
local holder = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
if holder and holder ~= '' and holder ~= ARGV[2] then
  redis.call('PUBLISH', ARGV[3], holder .. ' ' .. ARGV[4] .. ' ' .. string.sub(ARGV[1], 5))
end
return 1
"""

# KEYS: the record. ARGV: this replica, the heartbeat keys' prefix, the most claimed, the
# longest field. Each subscription whose holder's heartbeat is gone (or that was let go: no
# holder) becomes this replica's, up to the most (the rest at the next claim). A field longer
# than any URI a client can subscribe to was written by something else: left, never read (a
# hundred of 10 MB each came back whole in one answer).
_CLAIM = """
local fields = redis.call('HGETALL', KEYS[1])
local claimed, most, longest = {}, tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, #fields, 2 do
  local field, holder = fields[i], fields[i + 1]
  if #claimed >= most then
    break
  end
  if string.sub(field, 1, 4) == 'sub:' and #field <= longest and holder ~= ARGV[1]
      and (holder == '' or redis.call('EXISTS', ARGV[2] .. holder) == 0) then
    redis.call('HSET', KEYS[1], field, ARGV[1])
    table.insert(claimed, string.sub(field, 5))
  end
end
return claimed
"""
_CLAIM_MOST = 1000
"""Subscriptions claimed at once (a client's ``max_subscriptions`` by default)."""
_FIELD_LONGEST = len(SUBSCRIPTION) + 4 * MAX_URI_LENGTH
"""``sub:`` and a URI of ``access.MAX_URI_LENGTH`` characters, each up to four bytes."""


class SubscriptionHolders:
    """This replica's heartbeat, and the subscriptions it holds in its sessions' records."""

    def __init__(self, store: SharedStore, bus: Bus, records: SessionRecords, replica: str) -> None:
        self._store = store
        self._bus = bus
        self._records = records
        self._replica = replica
        self._claim = store.redis.register_script(_CLAIM)
        self._drop = store.redis.register_script(_DROP)

    async def beat(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Say this replica is alive until cancelled; then say it no more (its subscriptions
        are claimed at once rather than after ``HEARTBEAT_TTL``)."""
        key = self._store.key("replica", self._replica)
        task_status.started()
        try:
            while True:
                await self._store.call(self._store.redis.set(key, "1", ex=HEARTBEAT_TTL), "heartbeat")
                await anyio.sleep(_BEAT_EVERY)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self._store.call(self._store.redis.delete(key), "heartbeat_end")

    async def held(self, session_id: str, uri: str) -> None:
        """This replica took ``session_id``'s subscription to ``uri``."""
        await self._records.set_field(session_id, SUBSCRIPTION + uri, self._replica, "subscription_hold")

    async def let_go(self, session_id: str, uri: str) -> None:
        """This replica no longer holds it, but the client still wants it."""
        await self._records.set_field(session_id, SUBSCRIPTION + uri, "", "subscription_let_go")

    async def dropped(self, session_id: str, uri: str) -> None:
        """The client unsubscribed (or must subscribe again): no replica is to hold it; the
        one that does is told."""
        keys = [self._store.key("session", session_id)]
        args = [SUBSCRIPTION + uri, self._replica, self._store.key(DROPPED), session_id]
        if await self._store.call(self._drop(keys=keys, args=args), "subscription_drop") is None:
            await self._records.drop_field(session_id, SUBSCRIPTION + uri, "subscription_drop")

    def on_dropped(self, leave: Callable[[str, str], None]) -> None:
        """``leave`` each subscription this replica holds that its client dropped through
        another (its session id, its URI): it must not wait (the bus waits for it)."""

        async def heard(message: str) -> None:
            holder, _, rest = message.partition(" ")
            session_id, _, uri = rest.partition(" ")
            if holder == self._replica:
                leave(session_id, uri)

        self._bus.on(DROPPED, heard)

    async def orphaned(self, session_id: str) -> list[str]:
        """Claim ``session_id``'s subscriptions nobody holds now; their URIs."""
        keys = [self._store.key("session", session_id)]
        args = [self._replica, self._store.key("replica", ""), _CLAIM_MOST, _FIELD_LONGEST]
        claimed: list[bytes] | None = await self._store.call(
            self._claim(keys=keys, args=args), "subscription_claim"
        )
        return [uri.decode() for uri in claimed or ()]
