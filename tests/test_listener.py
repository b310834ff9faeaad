"""The listener's protocol sends a response's head with its body (``listener.HeadWithBody``),
seen in the writes that reach a real uvicorn connection's transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from starlette.types import Receive, Scope, Send

from agent_gateway.listener import Connections, bounded_protocol
from tests.support import serving


class Recorded:
    """A connection's real transport, with what is written to it kept in order."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def answer(scope: Scope, receive: Receive, send: Send, release: anyio.Event) -> None:
    await receive()
    if scope["path"] == "/json":
        body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await release.wait()  # the head must reach the client before any body
    await send({"type": "http.response.body", "body": b"data: 1\n\n"})


@asynccontextmanager
async def listening(writes: list[bytes], release: anyio.Event) -> AsyncIterator[str]:
    base = bounded_protocol(Connections(cap=16, per_address=16, header_timeout=5.0))

    class Recording(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(Recorded(transport, writes))  # type: ignore[arg-type]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            for done in ("lifespan.startup.complete", "lifespan.shutdown.complete"):
                await receive()
                await send({"type": done})
            return
        await answer(scope, receive, send, release)

    async with serving(app, http=Recording) as url:
        yield url


async def test_a_json_answer_is_written_once_with_its_head_and_a_stream_head_is_not_held() -> None:
    writes: list[bytes] = []
    release = anyio.Event()
    async with listening(writes, release) as url, httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(f"{url}/json", content=b"{}")
        assert answer.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert len(writes) == 1, writes  # before: the head, then the body
        assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert writes[0].endswith(b'\r\n\r\n{"jsonrpc":"2.0","id":1,"result":{}}')

        del writes[:]
        async with client.stream("POST", f"{url}/stream", content=b"{}") as stream:
            # The head arrives while the app still waits to send the body: held for one turn only.
            assert stream.headers["content-type"] == "text/event-stream"
            assert len(writes) == 1
            assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
            release.set()
            assert await stream.aread() == b"data: 1\n\n"
