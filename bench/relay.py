"""The floor of a hop: a TCP relay that copies bytes between a client and the upstream.

``overhead.py`` measures it beside the gateway (``--floor``): an extra process on the path
costs its wake-ups, system calls and scheduling whatever that process does, and on a shared
2-core machine that cost is large and drifts. The relay does nothing else (no HTTP parsing,
no MCP), so what the gateway adds *over the relay* is what its own work costs.

Each client connection gets one upstream connection of its own; bytes are passed on as they
arrive, with back-pressure both ways (a side whose buffer is full pauses the other's reads).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast
from urllib.parse import urlsplit

import anyio


class _Side(asyncio.Protocol):
    """One end of a relayed connection; ``peer`` is the other end, once connected."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []  # what arrived before the peer was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self.early.append(data)
            return
        self.peer.transport.write(data)

    def eof_received(self) -> bool | None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

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
    sides: list[_Side] = []

    async def pair(client: _Side) -> None:
        try:
            _, far = await loop.create_connection(_Side, host, port)
        except OSError:
            if client.transport is not None:
                client.transport.close()
            return
        sides.append(far)
        client.peer, far.peer = far, client
        for chunk in client.early:
            assert far.transport is not None
            far.transport.write(chunk)
        client.early.clear()

    async with anyio.create_task_group() as connecting:

        def accepted() -> _Side:
            client = _Side()
            sides.append(client)
            connecting.start_soon(pair, client)
            return client

        server = await loop.create_server(accepted, "127.0.0.1", 0)
        listening = server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{listening}{target.path}"
        finally:
            server.close()
            for side in sides:
                if side.transport is not None:
                    side.transport.close()
            connecting.cancel_scope.cancel()
