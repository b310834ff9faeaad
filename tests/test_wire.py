"""The forwarder's POSTs on connections of their origin's own (``upstreams/wire.py``), through
``AiohttpTransport.post`` as the forwarder sends them, against real servers."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2
import pytest

from agent_gateway.in_flight import IN_FLIGHT, bounded
from agent_gateway.upstreams.http_client import ssl_context
from agent_gateway.upstreams.http_transport import AiohttpTransport, OversizedBody
from tests.support import free_port, serving
from tests.test_http_transport import BOUND, Peers, raw_server, self_signed

JSON = {"content-type": "application/json"}


def transport(**options: int) -> AiohttpTransport:
    return AiohttpTransport(max_connections=4, ssl_context=ssl_context(), max_body_bytes=2**20, **options)


async def post(
    wire: AiohttpTransport,
    url: str,
    content: bytes = b"{}",
    headers: dict[str, str] = JSON,
    read: float = 5.0,
) -> tuple[int, bytes]:
    async with wire.post(wire.target(url), content, headers, httpx2.Timeout(5.0, read=read)) as answer:
        return answer.status, await answer.read()


async def test_posts_go_out_with_each_header_once_and_share_one_kept_alive_connection() -> None:
    peers = Peers()
    wire = transport()
    async with serving(peers) as base:
        try:
            answers = [
                await post(wire, f"{base}/echo", b"call %d" % n, JSON | {"x-trace": "t1"}) for n in range(3)
            ]
        finally:
            await wire.aclose()
    assert answers == [(200, b"echo:call 0"), (200, b"echo:call 1"), (200, b"echo:call 2")]
    assert len(set(peers.ports)) == 1
    assert peers.header(0, b"x-trace") == [b"t1"]
    for name in (b"host", b"content-length", b"content-type"):
        assert len(peers.header(0, name)) == 1, name
    assert peers.header(0, b"accept-encoding") == []  # the answer is read as sent, never decoded


@contextmanager
def descriptors_past(count: int) -> Iterator[None]:
    """This process holding ``count`` descriptors more, so the next sockets' numbers pass it
    (the soft limit raised to the hard one if it is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_connection_numbered_past_1023_is_kept_alive_too() -> None:
    """select() refuses descriptors past 1023: a busy gateway would never have reused one."""
    peers = Peers()
    wire = transport()
    async with serving(peers) as base:
        try:
            with descriptors_past(1100):  # every lower number taken: the connection's is past them
                for n in range(3):
                    assert await post(wire, f"{base}/echo", b"%d" % n) == (200, b"echo:%d" % n)
        finally:
            await wire.aclose()
    assert len(set(peers.ports)) == 1


async def test_an_answer_left_part_read_closes_its_connection() -> None:
    peers = Peers()
    wire = transport()
    async with serving(peers) as base:
        try:
            await post(wire, f"{base}/echo")
            async with wire.post(wire.target(f"{base}/stream"), b"{}", JSON, httpx2.Timeout(5.0)) as answer:
                chunks = answer.as_httpx2().aiter_bytes()
                with anyio.fail_after(BOUND):
                    assert await anext(chunks) == b"first"  # before the server has sent the rest
            with anyio.fail_after(BOUND):  # not queued behind the stream the server still sends
                after = await post(wire, f"{base}/echo", b"after")
            peers.release.set()
        finally:
            await wire.aclose()
    assert after == (200, b"echo:after")
    first, abandoned, last = peers.ports
    assert first == abandoned
    assert last != abandoned


async def test_a_connection_the_server_dropped_while_idle_is_not_used_again() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    wire = transport()
    dropped = anyio.Event()  # the server answers once, keep-alive by its headers, then closes
    async with raw_server(lambda _: ok, closed=dropped) as (base, _):
        try:
            assert await post(wire, base) == (200, b"{}")
            with anyio.fail_after(BOUND):
                await dropped.wait()
            assert await post(wire, base) == (200, b"{}")  # on a new connection, not the dropped one
        finally:
            await wire.aclose()


async def test_a_connection_that_answers_twice_to_one_request_is_not_used_again() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray"
    wire = transport()
    async with raw_server(lambda _: ok + stray) as (base, heads):
        try:
            assert await post(wire, base) == (200, b"{}")
            assert await post(wire, base) == (200, b"{}")  # not the stray answer, on a new connection
        finally:
            await wire.aclose()
    assert len(heads) == 2


async def test_a_header_line_that_never_ends_is_refused_once_past_the_bound() -> None:
    wire = transport()
    held = anyio.Event()  # the connection stays open, silent, after the endless line's start
    async with raw_server(lambda _: b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * (100 * 1024), hold=held) as (
        base,
        _,
    ):
        try:
            with pytest.raises(httpx2.RemoteProtocolError, match="too large"):
                await post(wire, base, read=BOUND)  # refused, not waited on until the read timeout
        finally:
            held.set()
            await wire.aclose()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}", (200, b"{}")),  # ends at close
        (
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            (200, b"{}"),
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", (204, b"")),
    ],
    ids=["body-until-close", "interim-first", "no-content"],
)
async def test_answers_are_read_as_http_frames_them(answer: bytes, expected: tuple[int, bytes]) -> None:
    wire = transport()
    async with raw_server(lambda _: answer) as (base, _):
        try:
            assert await post(wire, base) == expected
        finally:
            await wire.aclose()


async def test_a_post_waits_for_a_free_connection_no_longer_than_the_pool_timeout() -> None:
    peers = Peers()
    wire = AiohttpTransport(max_connections=1)
    async with serving(peers) as base:
        try:
            async with wire.post(wire.target(f"{base}/stream"), b"{}", JSON, httpx2.Timeout(5.0)):
                with pytest.raises(httpx2.PoolTimeout):
                    async with wire.post(
                        wire.target(f"{base}/echo"), b"{}", JSON, httpx2.Timeout(5.0, pool=0.2)
                    ):
                        pass
            peers.release.set()
            assert await post(wire, f"{base}/echo") == (200, b"echo:{}")  # the slot was given back
        finally:
            await wire.aclose()


async def test_a_refused_connection_and_a_silent_server_are_httpx2s_errors() -> None:
    port = free_port()
    peers = Peers()
    wire = transport()
    try:
        with pytest.raises(httpx2.ConnectError):
            await post(wire, f"http://127.0.0.1:{port}/")
        async with serving(peers) as base:
            with pytest.raises(httpx2.ReadTimeout):
                await post(wire, f"{base}/silent", read=0.3)
            peers.release.set()
    finally:
        await wire.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",  # cut short
        b"HTTP/1.1 200 OK\r\nNot a header\r\n\r\n",  # malformed
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * (70 * 1024) + b"\r\nContent-Length: 0\r\n\r\n",  # past 64 KiB
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * (70 * 1024),  # a header line that never ends
    ],
    ids=["cut-short", "malformed", "headers-too-large", "header-without-end"],
)
async def test_a_broken_answer_is_httpx2s_remote_protocol_error_without_the_url(answer: bytes) -> None:
    wire = transport()
    async with raw_server(lambda _: answer) as (base, _):
        try:
            with pytest.raises(httpx2.RemoteProtocolError) as raised:
                await post(wire, f"{base}/mcp?api_key=SECRET")
        finally:
            await wire.aclose()
    assert "SECRET" not in str(raised.value)


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    wire = transport()
    async with raw_server(lambda _: ok) as (base, heads):
        try:
            with pytest.raises(httpx2.LocalProtocolError):
                await post(wire, base, headers=JSON | {"mcp-name": "tool\r\nx-injected: 1"})
        finally:
            await wire.aclose()
    assert heads == []


async def test_https_is_verified_against_the_store_httpx2_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    peers = Peers()
    async with serving(peers, ssl_certfile=cert, ssl_keyfile=key) as base:
        wire = transport()  # the system store: this certificate is unknown to it
        try:
            with pytest.raises(httpx2.ConnectError):
                await post(wire, f"{base}/echo")
        finally:
            await wire.aclose()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how an operator trusts a private CA
        wire = transport()
        try:
            assert await post(wire, f"{base}/echo", b"over tls") == (200, b"echo:over tls")
        finally:
            await wire.aclose()


async def test_a_whole_answer_past_its_bounds_is_refused_and_holds_nothing() -> None:
    def answer(size: int) -> bytes:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        return head + b"%x\r\n" % size + b"x" * size + b"\r\n0\r\n\r\n"

    wire = AiohttpTransport(max_connections=2, max_body_bytes=2**30)
    small = AiohttpTransport(max_connections=2, max_body_bytes=2**10)
    try:
        async with bounded(2 * 2**20):
            async with raw_server(lambda _: answer(2**20)) as (base, _):
                status, fitting = await post(wire, base)
            assert (status, len(fitting), IN_FLIGHT.held) == (200, 2**20, 0)  # read, closed: given back
            async with raw_server(lambda _: answer(3 * 2**20)) as (base, _):
                with pytest.raises(OversizedBody, match="its bound of 2 MiB of answers in flight"):
                    await post(wire, base)
            assert IN_FLIGHT.held == 0
            async with raw_server(lambda _: answer(2**11)) as (base, _):
                with pytest.raises(OversizedBody, match="max_message_bytes"):
                    await post(small, base)
            assert IN_FLIGHT.held == 0
    finally:
        await wire.aclose()
        await small.aclose()


async def test_through_a_proxy_a_post_goes_on_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    async with raw_server(lambda _: ok) as (proxy, heads):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        wire = transport()
        try:
            assert wire.target("http://upstream.invalid/mcp").origin is None
            assert await post(wire, "http://upstream.invalid/mcp") == (200, b"{}")
        finally:
            await wire.aclose()
    assert heads[0].startswith(b"POST http://upstream.invalid/mcp HTTP/1.1")
    assert b"accept-encoding" not in heads[0].lower()  # the answer is read as it comes, never decoded
