"""The HTTP layer under Streamable HTTP upstreams: httpx2's API over aiohttp's connections."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from anyio.abc import SocketStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.types import Receive, Scope, Send

from agent_gateway.in_flight import IN_FLIGHT, bounded
from agent_gateway.upstreams.answer import CutShort
from agent_gateway.upstreams.http_client import ssl_context
from agent_gateway.upstreams.http_transport import AiohttpTransport, OversizedBody
from tests.support import free_port, serving

BOUND = 10.0


@asynccontextmanager
async def client(read_timeout: float = 5.0) -> AsyncIterator[httpx2.AsyncClient]:
    timeout = httpx2.Timeout(5.0, read=read_timeout)
    transport = AiohttpTransport(max_connections=8, ssl_context=ssl_context())
    async with httpx2.AsyncClient(transport=transport, timeout=timeout) as http:
        yield http


class Peers:
    """An ASGI app that records each request's client port and headers."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.headers: list[list[tuple[bytes, bytes]]] = []
        self.release = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.ports.append(scope["client"][1])
        self.headers.append(list(scope["headers"]))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(b"content-type", b"text/plain"), (b"set-cookie", b"sid=abc; Path=/")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["path"] == "/stream":  # one chunk now, the next once the test says so
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            with anyio.fail_after(BOUND):
                await self.release.wait()
            await send({"type": "http.response.body", "body": b"second"})
        elif scope["path"] == "/silent":
            with anyio.fail_after(BOUND):
                await self.release.wait()
            await send({"type": "http.response.body", "body": b"late"})
        else:
            await send({"type": "http.response.body", "body": b"echo:" + body})

    def header(self, request: int, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers[request] if key == name]


async def test_a_request_goes_out_with_its_headers_and_body_each_once_and_the_answer_comes_back() -> None:
    peers = Peers()
    async with serving(peers) as base, client() as http:
        response = await http.post(f"{base}/echo", content=b"hello", headers={"x-trace": "t1"})
    assert response.status_code == 200
    assert response.text == "echo:hello"
    assert peers.header(0, b"x-trace") == [b"t1"]
    for name in (b"host", b"content-length", b"user-agent", b"accept-encoding"):
        assert len(peers.header(0, name)) == 1, name


async def test_cookies_are_httpx2s_alone_and_sent_once() -> None:
    peers = Peers()
    async with serving(peers) as base, client() as http:
        local = base.replace("127.0.0.1", "localhost")  # aiohttp's own jar skips IP hosts
        await http.get(f"{local}/echo")
        await http.get(f"{local}/echo")
    assert peers.header(1, b"cookie") == [b"sid=abc"]


async def test_credentials_in_the_url_become_one_authorization_header() -> None:
    peers = Peers()
    async with serving(peers) as base, client() as http:
        response = await http.get(base.replace("http://", "http://user:secret@") + "/echo")
    assert response.status_code == 200
    assert peers.header(0, b"authorization") == [b"Basic dXNlcjpzZWNyZXQ="]


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
        peers.release.set()
    first, second, abandoned, after = peers.ports
    assert first == second == abandoned
    assert after != abandoned


async def test_a_refused_connection_is_httpx2s_connect_error() -> None:
    port = free_port()
    async with client() as http:
        with pytest.raises(httpx2.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")


async def test_a_server_that_does_not_answer_in_time_is_httpx2s_read_timeout() -> None:
    peers = Peers()
    async with serving(peers) as base, client(read_timeout=0.3) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await http.get(f"{base}/silent")
        peers.release.set()


@asynccontextmanager
async def raw_server(
    answer: Callable[[bytes], bytes], *, hold: anyio.Event | None = None, closed: anyio.Event | None = None
) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A one-shot TCP server: records the request's head, writes ``answer(head)``, closes (once
    ``hold`` is set, if given; then sets ``closed``, if given)."""
    heads: list[bytes] = []

    async def serve(stream: SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            heads.append(head)
            await stream.send(answer(head))
            if hold is not None:
                await hold.wait()
        if closed is not None:
            closed.set()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield f"http://127.0.0.1:{port}", heads
        tg.cancel_scope.cancel()


async def test_a_body_cut_short_by_the_server_is_a_stream_error_the_sdk_fails_its_request_for() -> None:
    # Not httpx2's RemoteProtocolError, a transport error the SDK's client ends the whole
    # session for: a StreamError, which it answers the one request with (translation.py).
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"
    async with raw_server(lambda _: cut) as (base, _), client() as http:
        with pytest.raises(CutShort) as raised:
            await http.get(f"{base}/")
    assert isinstance(raised.value, httpx2.StreamError)


async def test_a_malformed_answer_is_reported_without_the_url_and_its_secrets() -> None:
    broken = b"HTTP/1.1 200 OK\r\nNot a header\r\n\r\n"
    async with raw_server(lambda _: broken) as (base, _), client() as http:
        with pytest.raises(httpx2.RemoteProtocolError) as raised:
            await http.get(f"{base}/mcp?api_key=SECRET")
    assert "SECRET" not in str(raised.value)


async def test_the_environments_proxy_carries_requests_and_no_proxy_hosts_go_direct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nproxied"
    peers = Peers()
    async with raw_server(lambda _: ok) as (proxy, heads), serving(peers) as base:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", "localhost")
        async with client() as http:
            proxied = await http.post("http://upstream.invalid/mcp", content=b"{}")
            direct = await http.get(base.replace("127.0.0.1", "localhost") + "/echo")
    assert proxied.text == "proxied"
    assert heads[0].startswith(b"POST http://upstream.invalid/mcp HTTP/1.1")
    assert direct.text == "echo:"
    assert len(peers.ports) == 1


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``directory``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


async def test_https_upstreams_are_verified_against_the_store_httpx2_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    peers = Peers()
    async with serving(peers, ssl_certfile=cert, ssl_keyfile=key) as base:
        async with client() as http:  # the system store: this certificate is unknown to it
            with pytest.raises(httpx2.ConnectError):
                await http.get(f"{base}/echo")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how an operator trusts a private CA
        transport = AiohttpTransport(max_connections=2, ssl_context=ssl_context())
        async with httpx2.AsyncClient(transport=transport) as http:
            response = await http.post(f"{base}/echo", content=b"over tls")
    assert response.text == "echo:over tls"


async def test_a_whole_answer_past_the_bound_of_bytes_in_flight_is_refused_and_holds_nothing() -> None:
    def answer(size: int) -> bytes:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        return head % size + b"x" * size

    transport = AiohttpTransport(max_connections=8, max_body_bytes=2**30)
    async with bounded(2 * 2**20), httpx2.AsyncClient(transport=transport) as http:
        async with raw_server(lambda _: answer(2**20)) as (base, _):
            fitting = await http.get(base)
        assert IN_FLIGHT.held == 0  # read and closed: given back
        async with raw_server(lambda _: answer(3 * 2**20)) as (base, _):
            with pytest.raises(OversizedBody, match="its bound of 2 MiB of answers in flight"):
                await http.get(base)
        assert IN_FLIGHT.held == 0
    assert len(fitting.content) == 2**20
