"""The client transport for ``transport: websocket`` upstreams: MCP over one WebSocket.

mcp 1.x shipped this transport (``mcp.client.websocket``); mcp 2.x dropped it, but servers
that speak it are still deployed, so the gateway keeps the same wire here: the client asks
for the ``mcp`` subprotocol and each JSON-RPC message travels as one text frame.

The connection is bridged to the memory streams an ``mcp.Client`` expects, like the SDK's
own stdio and SSE clients: a frame that does not parse reaches the session as an exception
value, and a closed connection ends the read stream so the gateway sees the upstream go.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.typing import Subprotocol

from agent_gateway.compat.mcp import TransportStreams, Unreadable, parse_message
from agent_gateway.compat.websockets import checking_pings
from agent_gateway.in_flight import IN_FLIGHT
from agent_gateway.noise import QuietCount, UpstreamNoise
from agent_gateway.upstreams.pings import PINGS, PingBounds, Pings
from agent_gateway.upstreams.stdio import Oversized, is_utf8, refusal, unread

logger = logging.getLogger(__name__)

SUBPROTOCOL = Subprotocol("mcp")
MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message accepted from the upstream: tool results can be big (images, files)."""
QUEUED_FRAMES = 1
"""Messages received ahead of the one being parsed. The library's default, 16, held up to 16
of the largest (2 GiB at 128 MiB each) from an upstream writing them back to back."""
COMPRESSION = None
"""No permessage-deflate is offered (the library offers it by default). Inflating runs on the
event loop, a whole message at once: 100 KB of deflated text became a 100 MB message in 0.3 s
of the loop for every client, a thousandfold of the upstream's bytes. Upstreams are near the
gateway; its CPU is the scarcer resource."""
CLOSE_TIMEOUT = 2.0
"""How long the closing handshake may take before the socket is dropped."""

Incoming = SessionMessage | Exception


@asynccontextmanager
async def websocket_client(
    url: str,
    headers: Mapping[str, str],
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    label: str = "websocket",
    pings: PingBounds = PINGS,
    ended: Callable[[str], None] | None = None,
) -> AsyncIterator[TransportStreams]:
    """Connect to the MCP server at ``url`` (ws:// or wss://), sending ``headers`` in the
    handshake; yield its read and write streams. Leaving the context closes the connection.
    ``label`` names the upstream session in the log lines about what it sends; past ``pings``
    the connection is closed (``upstreams/pings.py``); ``ended`` is told why the connection
    ended (its close code and reason) before the read stream ends, so the calls it fails say so.

    Opening is not bounded here: the caller bounds it (the gateway's ``connect_timeout``).
    """
    connection = await _connect(url, headers, max_message_bytes, pings)
    try:
        async with _bridged(connection, label, max_message_bytes, ended or _unheard) as streams:
            yield streams
    finally:
        # Bounded by CLOSE_TIMEOUT, and shielded so a cancelled caller still frees the socket.
        with anyio.CancelScope(shield=True):
            await connection.close()


async def _connect(
    url: str, headers: Mapping[str, str], max_message_bytes: int, pings: PingBounds
) -> ClientConnection:
    return await connect(
        url,
        subprotocols=[SUBPROTOCOL],
        additional_headers=dict(headers),
        max_size=max_message_bytes,  # a bigger frame closes the connection (code 1009)
        max_queue=QUEUED_FRAMES,
        compression=COMPRESSION,
        open_timeout=None,
        close_timeout=CLOSE_TIMEOUT,
        create_connection=checking_pings(lambda unwritten: Pings(pings, unwritten).refusal),
    )


@asynccontextmanager
async def _bridged(
    connection: ClientConnection, label: str, limit: int, ended: Callable[[str], None]
) -> AsyncIterator[TransportStreams]:
    """Relay frames to and from memory streams in two tasks, stopped when the context exits."""
    read_writer, read_stream = anyio.create_memory_object_stream[Incoming](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    # Every end is closed here too: a task cancelled before its first step closes nothing.
    async with read_writer, read_stream, write_stream, write_reader, anyio.create_task_group() as tg:
        tg.start_soon(_read_frames, connection, read_writer, label, limit, ended)
        tg.start_soon(_write_frames, connection, write_reader)
        try:
            yield read_stream, write_stream
        finally:
            tg.cancel_scope.cancel()


async def _read_frames(
    connection: ClientConnection,
    sink: MemoryObjectSendStream[Incoming],
    label: str,
    limit: int,
    ended: Callable[[str], None],
) -> None:
    """Pass each frame on as a message until the connection closes, then say why (``ended``)
    and end the stream."""
    quiet = QuietCount("messages (not JSON-RPC)")
    async with sink:
        try:
            while True:
                # Bytes, not decoded to text first: msgspec reads UTF-8 (a copy of the message less).
                frame = await connection.recv(decode=False)
                message, size = _parse(frame, label, limit), len(frame)
                del frame  # not held while the message is taken (the next read's wait too): 32 MB more
                if isinstance(message, SessionMessage):
                    quiet.message()
                else:
                    quiet.heard(1, size)
                await sink.send(message)
        except UpstreamNoise as exc:  # the read ends here: its calls fail, saying why (and it is closed)
            ended(str(exc))
        except ConnectionClosed as closed:  # a clean close and a lost connection alike
            _ended(closed, label)
            ended(why_closed(closed))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the session stopped reading: it is closing


def _ended(closed: ConnectionClosed, label: str) -> None:
    """Log the connection's end: a WARNING when the gateway closed it for what the upstream
    sent (its pings), one per upstream session per 10 s (``logs.PeerRepeats``)."""
    if closed.sent is not None and closed.sent.code == CloseCode.POLICY_VIOLATION:
        logger.warning(
            "upstream session %s: websocket closed: %s", label, closed.sent.reason, extra={"peer": label}
        )
    else:
        logger.info("websocket connection of upstream session %s ended: %s", label, closed)


def why_closed(closed: ConnectionClosed) -> str:
    """What ended the connection, as a call it fails and the upstream's status say it: the
    upstream's close frame (its code and reason, at most 123 bytes by the protocol), the
    gateway's own, or none."""
    if closed.rcvd is not None:
        return f"the upstream closed its websocket: {closed.rcvd}"
    if closed.sent is not None:
        return f"the gateway closed its websocket: {closed.sent}"
    return "its websocket connection was lost (no close frame)"


def _unheard(_: str) -> None:
    """Nobody asked why the connection ended (the reader logs it all the same)."""


def _parse(frame: bytes, label: str, limit: int) -> Incoming:
    """One frame as a message, or the parse error as a value for the session to surface. Its
    bytes count against the process's bound in flight while it is parsed (``in_flight.py``):
    one that does not fit is refused as a stdio line would be (an error answer to its
    request). Parsed as stdio lines are (msgspec, then pydantic: a quarter of the memory)."""
    size = len(frame)
    if not IN_FLIGHT.take(size):
        return refusal(Oversized.held_back(frame), limit, label, logger)
    try:
        message = parse_message(frame)
    except Unreadable as exc:
        return unread(frame, str(exc), label, logger)
    except ValueError as exc:
        if not is_utf8(frame):  # answered at once, as an unreadable stdio line is
            return unread(frame, NOT_UTF8, label, logger)
        logger.warning("unparseable message from upstream session %s: %s", label, exc, extra={"peer": label})
        return exc
    finally:
        IN_FLIGHT.give(size)
    return SessionMessage(message)


NOT_UTF8 = "the upstream's message is not valid UTF-8, as a WebSocket text frame must be"


async def _write_frames(
    connection: ClientConnection, source: MemoryObjectReceiveStream[SessionMessage]
) -> None:
    """Send each message as one text frame; stop when the session or the connection closes."""
    async with source:  # once closed here, the session's sends fail instead of hanging
        try:
            async for session_message in source:
                await connection.send(
                    session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                )
        except ConnectionClosed:
            pass  # the reader sees the same close and ends the read stream
