"""A client's rate limit and live-session count, shared by every replica.

One Lua script per request, so one round trip: it refills and takes from the client's token
bucket, and for a request that opens a session (a handshake-era ``initialize``, or a
modern-era request, which is a session while it runs) counts the client's live sessions and
reserves a place among them. Sessions are members of a sorted set scored by when they expire
(each request on the session pushes that back, on any replica), so a replica that dies
leaves nothing counted for ever. Time is the Redis server's, the one clock all replicas share.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_gateway.access import Principal

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from agent_gateway.store.client import SharedStore

_RESERVATION = 60.0
"""Seconds a place taken by an opening request is held before the session is established."""
_TOUCH_EVERY = 10.0
"""Seconds between two pushes of a session's expiry from one replica (at most)."""


def touch_every(idle: float) -> float:
    """Seconds between two pushes of a session's expiry by one replica's requests."""
    return min(_TOUCH_EVERY, idle / 10)


def kept_for(idle: float) -> int:
    """Seconds the store keeps a session's record and count after a push of its expiry: its
    idle timeout and one push interval more. A replica's requests push it at most once a
    ``touch_every``, so a session's last request may come that long after the last push:
    kept for the idle timeout alone, the record ran out up to that long before the replica's
    own idle timer ended the session, and a request in between found it gone and wrote it
    again as a loss (a WARNING and a restore counted, for a session that was merely idle)."""
    return math.ceil(idle + touch_every(idle))


_TOUCHED_KEPT = 100_000
_SESSION_ID_MAX = 64
"""The longest session id worth a touch: replicas issue 32 hex digits (the SDK's ``uuid4().hex``);
an id of a header's length was kept whole, 100,000 of them at 60 KB each."""

# KEYS: bucket, sessions, the touched session's record. ARGV: rate (tokens/s, 0: none), burst, opening (0|1), cap,
# reservation id, reservation seconds, session id to touch ("" : none), session seconds, the client.
# Returns {verdict, wait in ms, sessions open[, the touched session's record was gone (1)]}:
# verdict 0 admitted, 1 rate, 2 sessions.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
if rate > 0 then
  local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
  local tokens, at = tonumber(b[1]) or burst, tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
  if tokens < 1 then
    return {1, math.ceil((1 - tokens) / rate * 1000), 0}
  end
  redis.call('HSET', KEYS[1], 'tokens', tokens - 1, 'at', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
end
local ttl = tonumber(ARGV[8])
local lost = 0
if ARGV[7] ~= '' then
  local client = redis.call('HGET', KEYS[3], 'client')
  if not client then
    lost = 1
  elseif client == ARGV[9] then  -- only its own client's requests keep it alive
    redis.call('EXPIRE', KEYS[3], math.ceil(ttl))
    -- Counted again if the count lost it (or the opening request is not settled yet).
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[7])
  end
end
local open = 0
if ARGV[3] == '1' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  open = redis.call('ZCARD', KEYS[2])
  if open >= tonumber(ARGV[4]) then
    return {2, 0, open}
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[5])
end
redis.call('EXPIRE', KEYS[2], math.ceil(ttl + tonumber(ARGV[6])))
return {0, 0, open, lost}
"""

# KEYS: sessions, the session's tombstone. ARGV: reservation id, session id ("" : the request
# opened none), seconds. A session ended already (its DELETE, on another replica, can come
# before its opening request is settled here) is not counted again: it would count for 30 min.
# The reservation was the set's one member when the client had no other session: its removal
# deleted the set and its expiry, so the set the ZADD makes anew is given one (without, each
# client that opened a session and never came back left a key for ever). Scored as a touch is,
# to the microsecond and never back (GT): the client's next request can come before the
# settle, and its touch, undone, made the session look used the longest ago of its client's.
_SETTLE = """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] ~= '' and redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  local expires = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], 'GT', expires, ARGV[2])
  if redis.call('TTL', KEYS[1]) < 0 then
    redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])))
  end
end
return 1
"""


@dataclass(frozen=True)
class Verdict:
    """What the shared limits decided for one request."""

    refused: str | None
    """``rate_limit`` or ``sessions``; None: admitted."""
    wait: float = 0.0
    """Seconds until the rate limit lets the client in again."""
    open: int = 0
    """The client's live sessions, counted when it opens one."""
    reservation: str | None = None
    """The place held for the session this request opens (settle it when the request ends)."""


class SharedLimits:
    """The rate limits and session caps of every client, counted once across replicas.

    A request goes to the store only when it must: its client has a rate limit, it opens a
    handshake-era session, or its session's expiry has not been pushed back for a while
    (``_TOUCH_EVERY``): the common call, by a client with no rate limit on a live session,
    costs no round trip.
    """

    def __init__(
        self, store: SharedStore, idle_seconds: float, on_lost: Callable[[str], Awaitable[None]]
    ) -> None:
        """``on_lost`` is told of a session whose record a request found gone."""
        self.store = store
        self._on_lost = on_lost
        self._session_seconds = kept_for(idle_seconds)
        self._touch_every = touch_every(idle_seconds)
        self._touched: dict[tuple[str, str], float] = {}
        self._admit: AsyncScript = store.redis.register_script(_ADMIT)  # pyright: ignore[reportAttributeAccessIssue]
        self._settle: AsyncScript = store.redis.register_script(_SETTLE)  # pyright: ignore[reportAttributeAccessIssue]

    def needed(self, client: Principal, session: str | None, *, opening: bool) -> bool:
        """Whether this request must ask the store (see the class docstring)."""
        if not self.store.available:
            return False
        if client.policy.rate_limit is not None or opening:
            return True
        return session is not None and self._touch_due(client, session)

    def _touch_due(self, client: Principal, session: str) -> bool:
        if len(session) > _SESSION_ID_MAX:  # no id a replica issues: the SDK answers it 404
            return False
        # By client too: another client naming this session's id takes no slot of its owner's
        # (whose own touches it would have put off, for as long as it kept naming it).
        key, now = (client.label, session), time.monotonic()
        if now - self._touched.get(key, -math.inf) < self._touch_every:
            return False
        if len(self._touched) >= _TOUCHED_KEPT:  # ended sessions are forgotten here too
            self._touched = {k: t for k, t in self._touched.items() if now - t < self._touch_every}
        self._touched[key] = now
        return True

    async def admit(self, client: Principal, session: str | None, *, opening: bool) -> Verdict | None:
        """Take a token from ``client``'s bucket, and a place among its sessions when the
        request opens one; None when the store could not be asked (use this replica's own)."""
        limit = client.policy.rate_limit
        rate = limit.per_minute / 60.0 if limit is not None else 0.0
        burst = limit.burst if limit is not None else 0
        reservation = f"opening:{uuid.uuid4().hex}" if opening else ""
        args = [
            rate,
            burst,
            int(opening),
            client.policy.max_sessions,
            reservation,
            _RESERVATION,
            session or "",
            self._session_seconds,
            client.label,
        ]
        keys = [*self._keys(client), self.store.key("session", session or "")]
        answer = await self.store.call(self._admit(keys=keys, args=args), "admit")
        if answer is None:
            return None
        verdict, wait_ms, open_now, *lost = (int(v) for v in answer)  # pyright: ignore[reportUnknownVariableType, reportGeneralTypeIssues]
        if lost == [1] and session is not None:
            await self._on_lost(session)
        if verdict == 1:
            return Verdict("rate_limit", wait=wait_ms / 1000.0)
        if verdict == 2:
            return Verdict("sessions", open=open_now)
        return Verdict(None, open=open_now, reservation=reservation or None)

    async def settle(self, client: Principal, reservation: str, session: str | None) -> None:
        """The opening request ended: count ``session`` (when it opened one) in place of its
        reservation."""
        args = [reservation, session or "", self._session_seconds]
        keys = [self._keys(client)[1], self.store.key("ended", session or "")]
        await self.store.call(self._settle(keys=keys, args=args), "settle")

    def _keys(self, client: Principal) -> list[str]:
        """The client's bucket and session count, by its label: its subject, and for an
        anonymous client its address (by subject, every anonymous client shared one count,
        and one of them with its 100 sessions open shut the others out on every replica)."""
        return [self.store.key("bucket", client.label), self.store.key("sessions", client.label)]


def retry_after(wait: float) -> int:
    """Whole seconds for a ``Retry-After`` header (at least 1)."""
    return max(1, math.ceil(wait))
