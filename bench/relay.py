"""The floor of a hop: a TCP relay that copies bytes between a client and the upstream.

``overhead.py`` measures it beside the gateway: an extra process on the path costs its
wake-ups, system calls and scheduling whatever that process does, and on a shared 2-core
machine that cost is large and drifts. The relay does nothing else (no HTTP parsing, no MCP),
so what the gateway adds *over the relay* is what its own work costs.

Each client connection gets one upstream connection of its own, opened within
``CONNECT_BOUND``; the client is not read until it is open (what a loop reads first is held,
and reading paused). Bytes are passed on as they
arrive, with back-pressure both ways (a side whose buffer is full pauses the other's reads),
and a half-close is passed on: a pair is closed once both directions have ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast
from urllib.parse import urlsplit

import anyio

CONNECT_BOUND = 10.0
"""Seconds the upstream connection of a client connection may take to open."""


class _Side(asyncio.Protocol):
    """One end of a relayed connection; ``peer`` is the other end, once connected."""

    def __init__(self, sides: set[_Side], *, waits: bool = False) -> None:
        """``waits``: not read until ``paired`` (a client, whose upstream is being opened)."""
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.ended = False  # what this side is connected to has sent its EOF
        self._sides = sides
        self._waits = waits
        self._early = b""  # what came before ``paired``

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._sides.add(self)
        if self._waits:
            self.transport.pause_reading()

    def paired(self, peer: _Side) -> None:
        self.peer, peer.peer = peer, self
        if self._early and peer.transport is not None:
            peer.transport.write(self._early)
            self._early = b""
        if self._waits and self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        elif self.transport is not None:  # a loop that starts reading after connection_made
            self._early += data
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self.ended = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.ended or not peer.transport.can_write_eof():
            self.close()  # both directions have ended (or the other end cannot half-close)
            return None
        peer.transport.write_eof()
        return True  # the other direction may still be under way

    def connection_lost(self, exc: Exception | None) -> None:
        self._sides.discard(self)
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def close(self) -> None:
        for side in (self, self.peer):
            if side is not None and side.transport is not None:
                side.transport.close()

    def pause_writing(self) -> None:  # our buffer is full: stop reading the other side
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


@asynccontextmanager
async def relay(upstream: str) -> AsyncIterator[str]:
    """A relay on a free loopback port to ``upstream``'s host and port; yields the URL with
    ``upstream``'s path, as a client would use it."""
    target = urlsplit(upstream)
    host, port = target.hostname or "127.0.0.1", target.port or 80
    loop = asyncio.get_running_loop()
    sides: set[_Side] = set()

    async def pair(client: _Side) -> None:
        try:
            with anyio.fail_after(CONNECT_BOUND):
                _, far = await loop.create_connection(lambda: _Side(sides), host, port)
        except (OSError, TimeoutError):
            client.close()
            return
        if client.transport is None or client.transport.is_closing():  # the client has gone
            far.close()
            return
        client.paired(far)

    async with anyio.create_task_group() as connecting:

        def accepted() -> _Side:
            client = _Side(sides, waits=True)
            connecting.start_soon(pair, client)
            return client

        server = await loop.create_server(accepted, "127.0.0.1", 0)
        listening = server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{listening}{target.path}"
        finally:
            server.close()
            for side in list(sides):
                side.close()
            await server.wait_closed()
            connecting.cancel_scope.cancel()
