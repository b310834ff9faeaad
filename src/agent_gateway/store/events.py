"""The SSE event store in Redis: a client whose stream dropped resumes it on any replica.

Each SSE stream is a Redis stream (``XADD`` with ``MAXLEN``: an atomic append, so two
replicas writing to one session's stream never race; FastMCP's own key-value event store
keeps a read-modify-write list per stream under an in-process lock, which its authors note
is only safe within one process).

Events are written behind: ``store_event`` names the event and queues it, and one writer
sends the queue in pipelines, so a call's answer never waits for Redis (awaiting each append
cost ~0.3 ms a call, more than everything else the store does). The price: an event sent in
the last moment before its replica died may be missing from the store; its client had it,
and a resume from it then replays nothing. A full queue drops events (counted), never calls.

Events of a session's notification stream (its GET stream: what no request caused, such as
a resource update or an upstream's log line) are also published on the ``live`` channel as
they are written: the replica that holds the client's GET stream may not be the one the
notification arose on, and it relays them (``compat/adoption.py``).

An event id is ``<replica>-<n>/<stream digest>``: it names its stream without carrying the
request id a client chose (which may hold anything, newlines included) into an SSE ``id:``
line, and is made here without a round trip. Streams are scoped to their session by
FastMCP's ``SessionScopedEventStore`` (the session id as its scope, ``compat/adoption.py``),
so a ``Last-Event-ID`` from one session replays nothing in another.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.streamable_http import (
    GET_STREAM_KEY,
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter
from opentelemetry import metrics
from pydantic import ValidationError

from agent_gateway.config import EventsConfig
from agent_gateway.refusals import refused
from agent_gateway.token_bucket import ByteBudget

if TYPE_CHECKING:
    from agent_gateway.store.client import SharedStore

logger = logging.getLogger(__name__)

Fields = dict[bytes, bytes]
Entry = tuple[bytes, Fields]
"""A Redis stream entry as redis-py reads it (id, fields)."""
Pending = tuple[str, str, str, bytes, bool]
"""An event waiting to be written: (key, stream id, event id, message, kept for a resume)."""
_PRIMING = b""
"""A priming event's stored message: it opens a stream and is never replayed."""
STREAMS = "streams"
"""A session's streams' keys (``streams:<session id>``, a sorted set by when each was last
written, those older than the ttl dropped as it is written): its DELETE deletes them. Kept for
their age, they outlived the session: a client opening and deleting sessions in a loop left
4,325 streams (21 MB) in 30 s."""
LIVE = "live"
"""The channel of notification-stream events, each ``<event id>\n<message>``."""
_LISTENING = ":" + GET_STREAM_KEY
"""How a session's notification stream id ends, once scoped by its session."""
_QUEUE = 10_000
_BATCH = 500
_PAGE = 4
"""Events read at a time while a resume finds its place (up to 4 MiB)."""
# KEYS: the stream. ARGV: the first id, how many, the most bytes of a field or value, the most
# fields and values. The entries (XRANGE's answer), or -1 when one holds more: this replica
# writes no event over ``max_event_bytes``, nor of more than its three fields, so something
# else wrote it, and read it held the replica's memory (four 100 MB entries in one page took a
# replica from 130 to 531 MB on one resume; 32 MiB in 32,768 fields of 1 KiB passed a bound on
# each alone). One entry at a time: Redis copies at most one such entry into the script.
_PAGE_READ = """
local page, start, most = {}, ARGV[1], tonumber(ARGV[3])
for _ = 1, tonumber(ARGV[2]) do
  local entry = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1)[1]
  if not entry then
    break
  end
  if #entry[2] > tonumber(ARGV[4]) then
    return -1
  end
  for _, part in ipairs(entry[2]) do
    if #part > most then
      return -1
    end
  end
  page[#page + 1] = entry
  start = '(' .. entry[1]
end
return page
"""
_STREAM_COST = 4096
_EVENT_COST = 256
"""What a priming event (it opens a stream: a key of its own, listed for its session) and any
other event cost their client's share at least: what Redis holds for them besides their message
(~4.4 KB a stream of one). Counted by their message alone, a priming event cost nothing, and a
client's tiny streams were kept without end."""
_SHARES_KEPT = 10_000
"""Clients' event budgets kept before those refilled are forgotten."""
_PARTS = 6
"""Fields and values of an event this replica writes (``s``, ``i`` and ``m``: ``_send``)."""
_REPLAYS = 4
"""Resumes read at once on one replica: each holds up to ``max_replay_bytes`` and a page; 40
at once, each reading a stream past the bound, took a replica to 1.3 GB."""
_dropped = metrics.get_meter("agent-gateway").create_counter(
    "agent_gateway.store.events_dropped",
    description="SSE events not stored for replay: the writer's queue was full.",
)
relayed = metrics.get_meter("agent-gateway").create_counter(
    "agent_gateway.store.notifications_relayed",
    description="Notifications another replica wrote, sent on the session's stream held here.",
)
unrelayed = metrics.get_meter("agent-gateway").create_counter(
    "agent_gateway.store.notifications_unrelayed",
    description="Notifications another replica wrote, dropped here: its client did not read its stream.",
)


class SharedEventStore(EventStore):
    """The SDK's ``EventStore`` on Redis streams, bounded by age and count, written behind."""

    def __init__(self, store: SharedStore, config: EventsConfig) -> None:
        self.store = store
        self._ttl = int(max(1, config.ttl))
        self._per_stream = config.per_stream
        self._max_event = config.max_event_bytes
        self._max_replay = config.max_replay_bytes
        self._replays = anyio.Semaphore(_REPLAYS)
        self._per_client = config.per_client
        self._shares: dict[str, ByteBudget] = {}
        self._pruned = -math.inf
        """Each client's budget of event bytes (``store.events.per_client``), by its label."""
        self.client_of: Callable[[str], str | None] = lambda _: None
        """The label of a session's client (its id), while this replica serves it."""
        self._page_read = store.redis.register_script(_PAGE_READ)
        self.replica = uuid.uuid4().hex[:12]
        """The first part of this replica's event ids."""
        self._numbers = itertools.count(1)
        self._queue: tuple[MemoryObjectSendStream[Pending], MemoryObjectReceiveStream[Pending]] = (
            anyio.create_memory_object_stream[Pending](_QUEUE)
        )
        _dropped.add(0)  # a series from the start
        relayed.add(0)
        unrelayed.add(0)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        digest = stream_digest(stream_id)
        event_id = f"{self.replica}-{next(self._numbers)}/{digest}"
        data = _PRIMING if message is None else jsonrpc_message_adapter.dump_json(message, by_alias=True)
        if len(data) > self._max_event:
            _dropped.add(1, {"reason": "too_large"})
            return event_id
        kept = self._within_share(stream_id, _cost(data))
        if not kept:
            _dropped.add(1, {"reason": "client_share"})
            if not stream_id.endswith(_LISTENING):  # else still published, for its stream's replica
                return event_id
        try:
            self._queue[0].send_nowait((self._key(digest), stream_id, event_id, data, kept))
        except (anyio.WouldBlock, anyio.ClosedResourceError):  # full, or the writer has stopped
            _dropped.add(1, {"reason": "queue_full"})
        return event_id

    def _within_share(self, stream_id: str, size: int) -> bool:
        """Whether the client of ``stream_id``'s session has ``per_client`` left to spend
        (then spent); else its events are not kept meanwhile (logged once per 10 s)."""
        session = session_of(stream_id)
        client = (self.client_of(session) if session is not None else None) or ""
        share = self._shares.get(client) or self._new_share(client)
        if share.wait() is not None:
            refused(
                "events", "client %s: its stream events past %d bytes within %d s are not kept for a resume",
                client, self._per_client, self._ttl, peer=client,
            )  # fmt: skip
            return False
        share.spend(size)
        return True

    def _new_share(self, client: str) -> ByteBudget:
        """A share for ``client``; past ``_SHARES_KEPT`` those refilled are forgotten (once a
        second at most: each look is a pass over all), and while none is, newcomers share one."""
        if len(self._shares) >= _SHARES_KEPT and (now := time.monotonic()) - self._pruned >= 1.0:
            self._pruned = now
            self._shares = {c: b for c, b in self._shares.items() if not b.full()}
        if len(self._shares) >= _SHARES_KEPT:
            client = ""
        return self._shares.setdefault(client, ByteBudget(self._per_client / self._ttl, self._per_client))

    async def write(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Send queued events to Redis in pipelines until cancelled (then what is queued, bounded)."""
        task_status.started()
        reader = self._queue[1]
        try:
            while True:
                batch = [await reader.receive()]
                batch += _drain(reader, _BATCH - 1)
                await self._send(batch)
        finally:
            self._queue[0].close()  # nothing more is queued once the writer stops
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.store.config.timeout):
                if rest := _drain(reader, _QUEUE):
                    await self._send(rest)
            reader.close()

    def close(self) -> None:
        """The queue closed, written or not (a store never reached never starts ``write``)."""
        for end in self._queue:
            end.close()

    async def _send(self, batch: list[Pending]) -> None:
        pipe = self.store.redis.pipeline(transaction=False)
        for key, stream_id, event_id, data, kept in batch:
            if kept:
                fields = {"s": stream_id, "i": event_id, "m": data}
                pipe.xadd(key, fields, maxlen=self._per_stream, approximate=True)  # pyright: ignore[reportArgumentType]
                pipe.expire(key, self._ttl)
            if stream_id.endswith(_LISTENING) and data != _PRIMING:
                pipe.publish(self.store.key(LIVE), event_id.encode() + b"\n" + data)
        # Events older than the ttl go, not only whole streams unwritten for as long: a stream
        # written to now and then (a resume adds a priming event) kept all it ever held.
        now = time.time()
        for key, stream_id in {key: stream_id for key, stream_id, *_, kept in batch if kept}.items():
            pipe.xtrim(key, minid=_oldest(self._ttl), approximate=False)
            if (session := session_of(stream_id)) is not None:  # listed for its DELETE
                listed = self.store.key(STREAMS, session)
                pipe.zadd(listed, {key: now})
                pipe.zremrangebyscore(listed, "-inf", now - self._ttl)
                pipe.expire(listed, self._ttl)
        await self.store.call(pipe.execute(), "event_store")

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        _, _, digest = last_event_id.partition("/")
        if not digest:
            logger.info("replay refused: %r is not an event id of this gateway", last_event_id[:100])
            return None
        async with self._replays:
            found = await self._after(digest, last_event_id)
            if found is None:
                return None
            stream_id, after = found
            for event_id, fields in after:
                if (message := _message(fields, digest)) is not None:
                    await send_callback(EventMessage(message, event_id))
            return stream_id

    async def _after(self, digest: str, last_event_id: str) -> tuple[str, list[tuple[str, Fields]]] | None:
        """The stream's id and its events after ``last_event_id``, read a page at a time (the
        events before it are not held); None when the stream or that event is no longer kept,
        or what follows it is past ``max_replay_bytes`` (a replay is held whole, by each
        resume: 20 resumes of a 40 MB stream held 1.4 GB)."""
        start, stream_id, seen, size = _oldest(self._ttl), "", False, 0
        after: list[tuple[str, Fields]] = []
        while True:
            page = await self._page(digest, start)
            if page is None:
                return None
            for _, fields in page:
                stream_id = stream_id or fields.get(b"s", b"").decode()
                event_id = fields.get(b"i", b"").decode()
                if not seen:
                    seen = event_id == last_event_id
                    continue
                if (size := size + len(fields.get(b"m", b""))) > self._max_replay:
                    logger.info(
                        "replay refused: past %d bytes after event %s", self._max_replay, last_event_id[:100]
                    )
                    return None
                after.append((event_id, fields))
            if len(page) < _PAGE:
                break
            start = "(" + page[-1][0].decode()
        if not seen:
            if stream_id:  # the stream is kept, not this event
                logger.info("replay: event %s is no longer kept (or was never stored)", last_event_id[:100])
            return None
        return stream_id, after

    async def _page(self, digest: str, start: str) -> list[Entry] | None:
        """Up to ``_PAGE`` events from ``start`` on; None: the store did not answer, or one of
        them is over ``max_event_bytes`` (logged, not read)."""
        args = [start, _PAGE, self._max_event, _PARTS]
        answer = await self.store.call(self._page_read(keys=[self._key(digest)], args=args), "event_replay")
        if isinstance(answer, int):
            logger.warning(
                "replay refused: stream %s holds an event over %d bytes or %d fields and values",
                digest, self._max_event, _PARTS,
            )  # fmt: skip
            return None
        if answer is None:
            return None
        entries: list[list[Any]] = answer
        return [(entry_id, dict(zip(parts[::2], parts[1::2], strict=True))) for entry_id, parts in entries]

    def _key(self, digest: str) -> str:
        return self.store.key("events", digest)


def _oldest(ttl: int) -> str:
    """The stream id before which events are older than ``ttl`` (Redis ids start with ms)."""
    return f"{int((time.time() - ttl) * 1000)}-0"


def _cost(data: bytes) -> int:
    """What an event costs its client's share (``_STREAM_COST``, ``_EVENT_COST``)."""
    return _STREAM_COST if data == _PRIMING else max(len(data), _EVENT_COST)


def _drain(reader: MemoryObjectReceiveStream[Pending], most: int) -> list[Pending]:
    out: list[Pending] = []
    while len(out) < most:
        try:
            out.append(reader.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            break
    return out


def _message(fields: Fields, digest: str) -> JSONRPCMessage | None:
    data = fields.get(b"m", _PRIMING)
    if data == _PRIMING:
        return None
    try:
        return jsonrpc_message_adapter.validate_json(data, by_name=False)
    except ValidationError:
        logger.warning("replay: an unreadable stored event on stream %s was skipped", digest)
        return None


def own_event(event_id: str, replica: str) -> bool:
    """Whether ``event_id`` was made by the replica whose event ids start with ``replica``."""
    return event_id.startswith(replica + "-")


def session_of(stream_id: str) -> str | None:
    """The session a stream id is scoped to (FastMCP's ``SessionScopedEventStore`` writes
    ``<length>:<session id>:<stream>``, ``tests/test_compat.py`` checks); None: not scoped."""
    length, _, rest = stream_id.partition(":")
    if not length.isdigit() or rest[int(length) : int(length) + 1] != ":":
        return None
    return rest[: int(length)]


def stream_digest(stream_id: str) -> str:
    return hashlib.blake2b(stream_id.encode(), digest_size=16).hexdigest()
