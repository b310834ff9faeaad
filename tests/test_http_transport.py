"""The HTTP layer under Streamable HTTP upstreams: httpx2's API over aiohttp's connections."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from starlette.types import Receive, Scope, Send

from agent_gateway.upstreams.http_transport import AiohttpTransport
from tests.support import free_socket, serving

BOUND = 10.0


@asynccontextmanager
async def client(read_timeout: float = 5.0) -> AsyncIterator[httpx2.AsyncClient]:
    timeout = httpx2.Timeout(5.0, read=read_timeout)
    async with httpx2.AsyncClient(transport=AiohttpTransport(max_connections=8), timeout=timeout) as http:
        yield http


class Peers:
    """An ASGI app that records which client port each request came from."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.release = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.ports.append(scope["client"][1])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(b"content-type", b"text/plain"), (b"x-seen", scope["path"].encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["path"] == "/stream":  # one chunk now, the next once the test says so
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            with anyio.fail_after(BOUND):
                await self.release.wait()
            await send({"type": "http.response.body", "body": b"second"})
        elif scope["path"] == "/silent":
            await anyio.sleep(BOUND)
        else:
            await send({"type": "http.response.body", "body": b"echo:" + body})


async def test_a_request_goes_out_with_its_headers_and_body_and_the_answer_comes_back() -> None:
    peers = Peers()
    async with serving(peers) as base, client() as http:
        response = await http.post(f"{base}/echo", content=b"hello", headers={"x-trace": "1"})
    assert response.status_code == 200
    assert response.headers["x-seen"] == "/echo"
    assert response.text == "echo:hello"


async def test_a_streamed_body_arrives_chunk_by_chunk_as_the_server_sends_it() -> None:
    peers = Peers()
    async with serving(peers) as base, client() as http, http.stream("GET", f"{base}/stream") as response:
        chunks = response.aiter_bytes()
        with anyio.fail_after(BOUND):
            assert await anext(chunks) == b"first"  # before the server has sent the rest
        peers.release.set()
        assert b"".join([chunk async for chunk in chunks]) == b"second"


async def test_a_finished_answer_gives_its_connection_back_and_an_abandoned_one_closes_it() -> None:
    peers = Peers()
    async with serving(peers) as base, client() as http:
        await http.post(f"{base}/echo", content=b"1")
        await http.post(f"{base}/echo", content=b"2")
        async with http.stream("GET", f"{base}/stream") as response:
            await anext(response.aiter_bytes())  # left part-read: its remaining bytes are not ours
        await http.post(f"{base}/echo", content=b"3")
    first, second, abandoned, after = peers.ports
    assert first == second == abandoned
    assert after != abandoned


async def test_a_refused_connection_is_httpx2s_connect_error() -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    async with client() as http:
        with pytest.raises(httpx2.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")


async def test_a_server_that_does_not_answer_in_time_is_httpx2s_read_timeout() -> None:
    async with serving(Peers()) as base, client(read_timeout=0.3) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await http.get(f"{base}/silent")


async def test_a_body_cut_short_by_the_server_is_httpx2s_remote_protocol_error() -> None:
    listener = free_socket()
    listener.listen()
    port = listener.getsockname()[1]

    def cut_short() -> None:
        peer, _ = listener.accept()
        peer.recv(65536)
        peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
        peer.shutdown(socket.SHUT_RDWR)
        peer.close()

    async with anyio.create_task_group() as tg, client() as http:
        tg.start_soon(anyio.to_thread.run_sync, cut_short)
        with pytest.raises(httpx2.RemoteProtocolError):
            await http.get(f"http://127.0.0.1:{port}/")
    listener.close()
