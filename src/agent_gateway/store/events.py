"""The SSE event store in Redis: a client whose stream dropped resumes it on any replica.

Each SSE stream is a Redis stream (``XADD`` with ``MAXLEN``: one atomic append, one round
trip with its expiry), so two replicas writing to one session never race; FastMCP's own
key-value event store keeps a read-modify-write list per stream under an in-process lock,
which its authors note is only safe within one process. An event id is
``<Redis entry id>/<stream key digest>``: it names its stream without carrying the request id
a client chose (which may hold anything, newlines included) into an SSE ``id:`` line.

Streams are scoped to their session by FastMCP's ``SessionScopedEventStore`` (with the
session id as its scope, ``compat/adoption.py``), so a ``Last-Event-ID`` from one session
replays nothing in another.
"""

from __future__ import annotations

import hashlib
import logging
import time

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter
from pydantic import ValidationError

from agent_gateway.config import EventsConfig
from agent_gateway.store.client import SharedStore

logger = logging.getLogger(__name__)

Entry = tuple[bytes, dict[bytes, bytes]]
"""A Redis stream entry as redis-py reads it (id, fields)."""
_PRIMING = b""
"""A priming event's stored message: it opens a stream and is never replayed."""


class SharedEventStore(EventStore):
    """The SDK's ``EventStore`` on Redis streams, bounded by age and count."""

    def __init__(self, store: SharedStore, config: EventsConfig) -> None:
        self.store = store
        self._ttl = int(max(1, config.ttl))
        self._per_stream = config.per_stream

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        digest = _digest(stream_id)
        data = _PRIMING if message is None else jsonrpc_message_adapter.dump_json(message, by_alias=True)
        key = self._key(digest)
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.xadd(key, {"s": stream_id, "m": data}, maxlen=self._per_stream, approximate=True)
        pipe.expire(key, self._ttl)
        answer = await self.store.call(pipe.execute(), "event_store")
        if answer is None:  # not stored: the event still goes out live, it cannot be replayed
            return f"0-0/{digest}"
        return f"{answer[0].decode()}/{digest}"

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        entry, _, digest = last_event_id.partition("/")
        if not digest or not _entry_id(entry):
            logger.info("replay refused: %r is not an event id of this gateway", last_event_id[:100])
            return None
        oldest = f"{int((time.time() - self._ttl) * 1000)}-0"
        start = max(entry, oldest, key=_entry_order)
        rows: list[Entry] | None = await self.store.call(
            self.store.redis.xrange(self._key(digest), min=f"({start}"), "event_replay"
        )
        if rows is None:
            return None
        if not rows:  # nothing missed: the stream's name is in any of its entries
            rows_before: list[Entry] | None = await self.store.call(
                self.store.redis.xrange(self._key(digest), count=1), "event_replay"
            )
            stream_id = _stream_of(rows_before or [])
        else:
            stream_id = _stream_of(rows)
        if stream_id is None:
            return None
        for event_id, fields in rows:
            message = fields.get(b"m", _PRIMING)
            if message == _PRIMING:
                continue
            try:
                parsed = jsonrpc_message_adapter.validate_json(message, by_name=False)
            except ValidationError:
                logger.warning("replay: an unreadable stored event on stream %s was skipped", digest)
                continue
            await send_callback(EventMessage(parsed, f"{event_id.decode()}/{digest}"))
        return stream_id

    def _key(self, digest: str) -> str:
        return self.store.key("events", digest)


def _digest(stream_id: str) -> str:
    return hashlib.blake2b(stream_id.encode(), digest_size=16).hexdigest()


def _entry_id(text: str) -> bool:
    ms, dash, seq = text.partition("-")
    return bool(dash) and ms.isdigit() and seq.isdigit()


def _entry_order(text: str) -> tuple[int, int]:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq)


def _stream_of(rows: list[Entry]) -> str | None:
    for _, fields in rows:
        if (stream := fields.get(b"s")) is not None:
            return stream.decode()
    return None
