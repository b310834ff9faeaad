"""Handshake-era sessions in the shared store, so that any replica can serve any of them.

The replica that answers ``initialize`` records what the handshake settled (the client's
``initialize`` params, the negotiated version, the credential that opened it); a replica
that then gets a request for a session it does not hold reads the record and adopts the
session (``compat/adoption.py``) instead of answering "Session not found". Each request
pushes the record's expiry back (in the admission script, ``store/limits.py``), so a session
expires after ``server.session_idle_timeout`` without a request on any replica (the record is
kept a touch interval longer, ``limits.kept_for``, so that it never runs out first). A DELETE
removes the record and the session's event streams, leaves a tombstone for as long, and is
announced, so every replica that adopted the session drops it.

A record the store lost while a replica still serves its session (opened while Redis could
not be reached, or gone with a restart, a flush or an eviction) is written again by that
replica (``restore``; when, ``store/keeper.py``), unless the tombstone says it was deleted.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types

from agent_gateway.errors import StoreUnavailable
from agent_gateway.store.events import STREAMS
from agent_gateway.store.limits import kept_for
from agent_gateway.store.record import FIELDS, READ, READ_MOST, UPSTREAM, SessionRecord, UpstreamRecord

if TYPE_CHECKING:
    from agent_gateway.store.client import SharedStore

logger = logging.getLogger(__name__)

ENDED = "ended"  # the channel on which a session's end is announced (its id the message)
LEVEL = "level"
"""The channel on which a session's new log level is announced (``<replica> <session id>
<level>``): the other replicas serving it filter its log lines by it too."""
RESTORED = "restored"
"""The channel on which a record written again after a request found it gone is announced
(its session id): each other replica serving the session adds what it holds of it."""

# KEYS: the record, its tombstone, its streams' keys (``events.STREAMS``). ARGV: the session
# id, the client counts' key prefix, the channel, seconds the tombstone is kept.
_END = """
local client = redis.call('HGET', KEYS[1], 'client')
for _, stream in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do redis.call('DEL', stream) end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SET', KEYS[2], '1', 'EX', ARGV[4])
if client then
  redis.call('ZREM', ARGV[2] .. client, ARGV[1])
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""

# KEYS: the record, its tombstone, its client's count. ARGV: the session id, seconds, the
# channel to announce a record written again on ('': none), then the record's fields and
# values. Returns -1: the session was deleted; 0: the record is there (what it lacked of this
# replica's fields, and its place in its client's count, added); 1: written again.
_RESTORE = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return -1
end
local written = 1 - redis.call('EXISTS', KEYS[1])
local seconds = tonumber(ARGV[2])
for i = 4, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
local t = redis.call('TIME')
if written == 1 then
  redis.call('EXPIRE', KEYS[1], seconds)
  redis.call('ZADD', KEYS[3], tonumber(t[1]) + seconds, ARGV[1])
  if ARGV[3] ~= '' then
    redis.call('PUBLISH', ARGV[3], ARGV[1])
  end
else
  local left = redis.call('TTL', KEYS[1])
  redis.call('ZADD', KEYS[3], 'NX', tonumber(t[1]) + (left > 0 and left or seconds), ARGV[1])
end
if redis.call('TTL', KEYS[3]) < seconds then
  redis.call('EXPIRE', KEYS[3], seconds)
end
return written
"""

# KEYS: the epoch. ARGV: a new value, taken when there is none. Returns the value's digest:
# each replica reads it every 2 s, and a value something else wrote there (100 MB) was read whole
# each time.
_EPOCH = """
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[1]
  redis.call('SET', KEYS[1], epoch)
end
return redis.sha1hex(epoch)
"""

# KEYS: the record. ARGV: the session id, the client counts' key prefix, seconds. Returns 0
# when the store lost the record or the session's place in its client's count.
_TOUCH = """
local client = redis.call('HGET', KEYS[1], 'client')
if not client then
  return 0
end
local seconds = tonumber(ARGV[3])
redis.call('EXPIRE', KEYS[1], seconds)
local t = redis.call('TIME')
local count = ARGV[2] .. client
local counted = redis.call('ZADD', count, 'XX', 'CH', tonumber(t[1]) + seconds, ARGV[1])
if redis.call('TTL', count) < seconds then
  redis.call('EXPIRE', count, seconds)
end
return counted
"""


# KEYS: the record. ARGV: a field, its value[, the value it must have now]. Only into a live
# record (it carries the expiry).
_SET_IF_LIVE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if ARGV[3] and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
# KEYS: the record. ARGV: the level, the channel, the message.
_LEVEL = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'level', ARGV[1])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
_UNSAID_KEPT = 100_000
_UNSAID_BYTES = 16 << 20
_BATCH = 500
"""Deletions or fields told in one round trip (a pipeline the store's timeout bounds)."""


class SessionRecords:
    """Session records in the shared store."""

    def __init__(self, store: SharedStore, idle_seconds: float, replica: str) -> None:
        """``replica``: this one (its own announcements are not acted on twice)."""
        self.store = store
        self.replica = replica
        self._idle = int(max(1, idle_seconds))
        self._kept = kept_for(self._idle)
        self._unsaid: set[str] = set()
        """Sessions deleted here while the store could not be told: told when it answers."""
        self._unsaid_fields: dict[tuple[str, str], str | None] = {}
        self._unsaid_bytes = 0
        """Likewise, record fields set (their last value) or dropped (None) meanwhile."""
        self._end = store.redis.register_script(_END)
        self._touch = store.redis.register_script(_TOUCH)
        self._set_if_live = store.redis.register_script(_SET_IF_LIVE)
        self._restore = store.redis.register_script(_RESTORE)
        self._level = store.redis.register_script(_LEVEL)
        self._epoch = store.redis.register_script(_EPOCH)
        self._read = store.redis.register_script(READ)

    @property
    def idle_seconds(self) -> int:
        return self._idle

    async def touch(self, session_id: str) -> bool | None:
        """Push ``session_id``'s expiry back (its open notification stream); False: the store
        has no record of it, None: the store did not say."""
        keys = [self.store.key("session", session_id)]
        args = [session_id, self.store.key("sessions", ""), self._kept]
        found = await self.store.call(self._touch(keys=keys, args=args), "session_touch")
        return None if found is None else bool(found)

    async def opened(self, record: SessionRecord) -> None:
        """Record a session whose ``initialize`` was answered."""
        key = self.store.key("session", record.id)
        pipe = self.store.redis.pipeline(transaction=True)
        fields: dict[Any, Any] = record.fields()
        pipe.hset(key, mapping=fields)  # pyright: ignore[reportUnknownMemberType]
        pipe.expire(key, self._kept)
        await self.store.call(pipe.execute(), "session_open")

    async def find(self, session_id: str) -> SessionRecord | None:
        """The record of ``session_id``, or None (unknown, expired, ended, unreadable or
        over ``READ_MOST`` bytes).

        Raises:
            StoreUnavailable: the store did not answer (the session may well be live)."""
        fields = await self._fields(session_id, FIELDS, "session_find")
        if fields is None:
            raise StoreUnavailable(f"the shared store does not answer ({self.store.problem})")
        return SessionRecord.parse(session_id, fields) if fields else None

    async def _fields(self, session_id: str, names: tuple[str, ...], what: str) -> dict[bytes, bytes] | None:
        """Those of ``names`` the record holds ({}: none, or more than ``READ_MOST`` bytes of
        them, logged: never read), in one round trip; None: the store did not answer."""
        keys = [self.store.key("session", session_id)]
        answer = await self.store.call(self._read(keys=keys, args=[READ_MOST, *names]), what)
        if isinstance(answer, int):
            logger.warning(
                "session %s: %d bytes of its record in the shared store, over %d: not read",
                session_id[:64], answer, READ_MOST,
            )  # fmt: skip
            return {}
        if answer is None:
            return None
        values: list[bytes | None] = answer
        return {n.encode(): v for n, v in zip(names, values, strict=True) if v is not None}

    async def level_set(self, session_id: str, level: types.LoggingLevel) -> None:
        """Record the session's log level (into its record only while it lives: set into a
        record the store lost, it would make a key of one field that never expires), and
        announce it to the other replicas serving the session."""
        keys = [self.store.key("session", session_id)]
        args = self._level_args(session_id, level)
        if await self.store.call(self._level(keys=keys, args=args), "session_level") is None:
            self._unsaid_field(session_id, "level", level)

    async def ended(self, session_id: str) -> None:
        """``session_id`` was deleted by its client: forget it everywhere (its record, its
        place in its client's count), and say so to the other replicas."""
        if await self._say_ended([session_id]) is None and len(self._unsaid) < _UNSAID_KEPT:
            self._unsaid.add(session_id)  # else another replica would write it again when back

    async def say_unsaid(self) -> bool:
        """Tell the store what this replica could not tell it meanwhile (before any record is
        written again): the sessions deleted here, the fields set or dropped (a level, a
        subscription let go); a batch at a time. False: it still does not answer."""
        while self._unsaid:
            batch = list(self._unsaid)[:_BATCH]
            if await self._say_ended(batch) is None:
                return False
            self._unsaid.difference_update(batch)
        while self._unsaid_fields:
            fields = list(self._unsaid_fields.items())[:_BATCH]
            pipe = self.store.redis.pipeline(transaction=False)
            for (session_id, name), value in fields:
                await self._field_op(pipe, session_id, name, value)
            if await self._execute(pipe, "session_fields") is None:
                return False
            for key, value in fields:  # unless changed again meanwhile
                if self._unsaid_fields.get(key, value) == value:
                    self._unsaid_fields.pop(key, None)
        self._unsaid_bytes = 0  # all told (an upper bound while any is left)
        return True

    async def _field_op(self, pipe: Any, session_id: str, field: str, value: str | None) -> None:
        key = self.store.key("session", session_id)
        if field == "level" and value is not None:
            await self._level(keys=[key], args=self._level_args(session_id, value), client=pipe)
        elif value is None:
            pipe.hdel(key, field)
        else:
            await self._set_if_live(keys=[key], args=self._field_args(field, value), client=pipe)

    def _level_args(self, session_id: str, level: str) -> list[str]:
        """The level script's arguments: the level, the channel, the announcement."""
        return [level, self.store.key(LEVEL), f"{self.replica} {session_id} {level}"]

    def _unsaid_field(self, session_id: str, field: str, value: str | None) -> None:
        # Bounded in bytes too: a field's name holds a URI, which a client names (megabytes).
        size = len(session_id) + len(field) + len(value or "")
        if len(self._unsaid_fields) < _UNSAID_KEPT and self._unsaid_bytes + size <= _UNSAID_BYTES:
            self._unsaid_fields[(session_id, field)] = value
            self._unsaid_bytes += size

    async def _say_ended(self, session_ids: list[str]) -> list[Any] | None:
        pipe = self.store.redis.pipeline(transaction=False)
        for session_id in session_ids:
            keys = [self.store.key(part, session_id) for part in ("session", "ended", STREAMS)]
            args = [session_id, self.store.key("sessions", ""), self.store.key(ENDED), self._kept]
            await self._end(keys=keys, args=args, client=pipe)
        return await self._execute(pipe, "session_end")

    async def _execute(self, pipe: Any, what: str) -> Any:
        """A pipeline's answers (None: the store failed), its connection given back either way."""
        try:
            return await self.store.call(pipe.execute(), what)
        finally:
            with anyio.CancelScope(shield=True):
                await pipe.reset()

    async def restore(self, records: Iterable[SessionRecord], *, announce: bool = False) -> list[int] | None:
        """Write again each of ``records`` the store no longer holds, and add what it lacks
        of the others (this replica's fields, their place in their client's count), in one
        round trip; for each, -1 (deleted: not written), 0 (still there) or 1 (written again,
        and said on ``RESTORED`` when ``announce``). None: the store did not answer."""
        channel = self.store.key(RESTORED) if announce else ""
        pipe = self.store.redis.pipeline(transaction=False)
        for record in records:
            keys = [
                self.store.key("session", record.id),
                self.store.key("ended", record.id),
                self.store.key("sessions", record.client),
            ]
            pairs = [part for item in record.fields().items() for part in item]
            await self._restore(keys=keys, args=[record.id, self._kept, channel, *pairs], client=pipe)
        answers: list[int] | None = await self._execute(pipe, "session_restore")
        return None if answers is None else [int(a) for a in answers]

    async def epoch(self) -> bytes | None:
        """The digest of a value the store keeps until it loses its data (a restart without
        persistence, a flush): a new one says records may be gone. None: the store did not answer."""
        keys = [self.store.key("epoch")]
        return await self.store.call(self._epoch(keys=keys, args=[secrets.token_hex(8)]), "epoch")

    async def live(self, session_id: str) -> bool | None:
        """Whether ``session_id`` is still open on some replica (None: the store did not say)."""
        found = await self.store.call(
            self.store.redis.exists(self.store.key("session", session_id)), "session_live"
        )
        return None if found is None else bool(found)

    async def upstream_opened(self, session_id: str, upstream: str, record: UpstreamRecord) -> None:
        """Record the dedicated ``upstream`` session opened for ``session_id`` (with the
        session's own record: it expires and ends with it)."""
        await self.set_field(session_id, UPSTREAM + upstream, record.text(), "upstream_session_open")

    async def upstream_session(self, session_id: str, upstream: str) -> UpstreamRecord | None:
        """The dedicated ``upstream`` session another replica opened for ``session_id``, if any."""
        name = UPSTREAM + upstream
        text = (await self._fields(session_id, (name,), "upstream_session_find") or {}).get(name.encode())
        return UpstreamRecord.parse(text.decode(errors="replace")) if text else None

    async def upstream_lost(self, session_id: str, upstream: str) -> None:
        """Forget a recorded upstream session the upstream no longer knows."""
        await self.drop_field(session_id, UPSTREAM + upstream, "upstream_session_lost")

    async def set_field(self, session_id: str, field: str, value: str, what: str) -> None:
        """Set one field of ``session_id``'s record, only while the record lives (it carries
        the expiry: a field set into an expired record would outlive it)."""
        keys = [self.store.key("session", session_id)]
        if (
            await self.store.call(self._set_if_live(keys=keys, args=self._field_args(field, value)), what)
            is None
        ):
            self._unsaid_field(session_id, field, value)

    def _field_args(self, field: str, value: str) -> list[str]:
        """A field set to ``value``; to "" (a subscription let go) only from this replica's own
        name: else a replica's copy of a session, ending after the client unsubscribed through
        another, wrote the subscription back as wanted, and the stream's holder took it again."""
        return [field, value, self.replica] if value == "" else [field, value]

    async def drop_field(self, session_id: str, field: str, what: str) -> None:
        key = self.store.key("session", session_id)
        if await self.store.call(self.store.redis.hdel(key, field), what) is None:  # pyright: ignore[reportUnknownMemberType, reportArgumentType]
            self._unsaid_field(session_id, field, None)
