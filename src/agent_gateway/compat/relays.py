"""Notifications another replica wrote, sent on a session's notification stream held here.

A replica that writes an event of a stream another replica holds publishes it on the bus
(``store/events.py``); the holder sends it on the stream. The bus handles its messages one
at a time, for every session and every kind of announcement, so the send must never wait on
a client there: before, it waited up to 5 s for room on the stream, and one client that did
not read its stream, with an upstream sending it updates twice a second, held up every
other session's notifications, ends and log levels on that replica (a session deleted on
one replica was served by the other for 6 s; a bystander's updates waited 30 s, and Redis
kept 11 MB of the replica's unread messages, then cut it off).

So each stream held here has its own queue, filled by the bus without waiting and emptied by
a task of the stream's own, which alone waits for the client (``_request_streams``: the SDK
transport's streams, private; ``tests/test_compat.py`` checks it). A queue holds at most
``_HELD`` bytes; past that an event is dropped, counted and, once a stream, logged: its
client replays what it missed from the store when it reconnects (``Last-Event-ID``).
"""

from __future__ import annotations

import logging
import math

import anyio
from mcp.server.streamable_http import GET_STREAM_KEY, EventMessage, StreamableHTTPServerTransport

from agent_gateway.compat.mcp import parse_message
from agent_gateway.store.events import relayed, unrelayed

logger = logging.getLogger(__name__)

_HELD = 1 << 20
"""Bytes of events one stream's queue holds (one event larger than this passes alone)."""


class Relays:
    """The events waiting for room on one notification stream held here."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, str]](math.inf)
        self._held = 0
        self._dropped = 0

    def put(self, event_id: str, data: str) -> None:
        """Queue one event (``data``: its JSON-RPC message), or drop it when the queue is full."""
        if self._held and self._held + len(data) > _HELD:
            self._drop()
            return
        try:
            self._send.send_nowait((event_id, data))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the stream closed: its client replays the event when back
        self._held += len(data)

    async def forward(self, transport: StreamableHTTPServerTransport) -> None:
        """Send each event queued on the transport's notification stream, for as long as it is
        open (this task alone waits for its client to read)."""
        async with self._receive:
            async for event_id, data in self._receive:
                self._held -= len(data)
                streams = transport._request_streams.get(GET_STREAM_KEY)  # pyright: ignore[reportPrivateUsage]
                if streams is None:
                    return
                try:
                    await streams[0].send(EventMessage(parse_message(data), event_id))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the stream closed meanwhile: the client replays the event when back
                relayed.add(1)
                logger.debug("notification %s from another replica sent on its stream here", event_id)

    def close(self) -> None:
        self._send.close()
        self._receive.close()  # also when the stream ended before its task began

    def _drop(self) -> None:
        unrelayed.add(1)
        self._dropped += 1
        if self._dropped == 1:
            logger.warning(
                "session %s: its client does not read its notification stream; notifications other "
                "replicas wrote for it are dropped here (replayed from the store when it reconnects)",
                self._session_id,
            )
