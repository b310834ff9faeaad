"""Hostile load (issue 16, findings 1, 2, 4 and 5): each attack reproduced against a real
gateway on loopback, bounded in time and count, with a bystander client served throughout.

The attacker connects from 127.0.0.2 and the bystander from 127.0.0.1 (both loopback): the
gateway tells anonymous clients apart by address, and caps connections per address.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_gateway.config import ConnectionsConfig
from agent_gateway.listener import connection_cap
from tests.replicas.test_store import events, opened
from tests.support import RunningGateway, running_gateway, serving_upstream

ATTACKER = "127.0.0.2"
BYSTANDER_TOKEN = "bystander-token-0123456789"
ATTACKER_TOKEN = "attacker-token-0123456789"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "1"},
    },
}


def _echo_server() -> FastMCP:
    server = FastMCP("echo")

    @server.tool
    def echo(text: str) -> str:
        return text

    @server.tool
    def big(megabytes: int) -> str:
        return "x" * megabytes * 2**20

    return server


@asynccontextmanager
async def gateway(extra: dict[str, Any]) -> AsyncIterator[RunningGateway]:
    async with serving_upstream(_echo_server()) as url:
        config = {"upstreams": {"echo": {"url": url}}} | extra
        async with running_gateway(config, environ={"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}) as gw:
            yield gw


def bearer(policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "auth": {
            "mode": "bearer",
            "tokens": [
                {"name": "bystander", "token": "${B}"},
                {"name": "attacker", "token": "${A}", "policy": "attacker"},
            ],
            "policies": {"attacker": policy},
        }
    }


@asynccontextmanager
async def client(url: str, token: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as c,
    ):
        yield c


async def echo(c: Client, text: str = "hi") -> str:
    result = await c.call_tool("echo__echo", {"text": text})
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


class Bystander:
    """Calls ``echo`` in a loop while the attack runs; every failure is kept."""

    def __init__(self) -> None:
        self.served = 0
        self.failures: list[str] = []

    async def run(self, c: Client) -> None:
        while True:
            try:
                with anyio.fail_after(10):
                    assert await echo(c) == "hi"
                self.served += 1
            except Exception as exc:
                self.failures.append(repr(exc))
            await anyio.sleep(0.05)


def _port(url: str) -> int:
    return httpx.URL(url).port or 80


# -- finding 1: idle and slow connections ------------------------------------------------


def test_the_connection_cap_leaves_room_for_the_gateways_own_descriptors() -> None:
    assert connection_cap(ConnectionsConfig(), upstreams=4, fds=1024) == 1024 - 256 - 4 * 16
    assert connection_cap(ConnectionsConfig(), upstreams=0, fds=1_048_576) == 10_000
    assert connection_cap(ConnectionsConfig(max=300), upstreams=0, fds=1024) == 300
    assert connection_cap(ConnectionsConfig(), upstreams=100, fds=256) == 16


def _slow_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((ATTACKER, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a head that never ends
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        data = sock.recv(4096)
    except ConnectionResetError:
        return True  # closed with the head unread
    except TimeoutError:
        return False  # still open after 5 s: not cut off
    return data == b"" or data.startswith(b"HTTP/1.1 503")


async def test_slow_heads_are_cut_off_and_one_address_cannot_take_every_connection() -> None:
    server = {"server": {"connections": {"header_timeout": 1, "per_address": 40}}}
    bystander = Bystander()
    async with gateway(server) as gw, client(gw.url) as c, anyio.create_task_group() as tg:
        tg.start_soon(bystander.run, c)
        port = _port(gw.url)
        socks = [await anyio.to_thread.run_sync(_slow_socket, port) for _ in range(120)]
        try:
            # Past 40 from one address, new connections are refused (a bare 503, then closed);
            # the 40 admitted ones are closed once their head is 1 s late.
            with anyio.fail_after(20):
                closed = [await anyio.to_thread.run_sync(_closed_by_server, s) for s in socks]
            assert all(closed)
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{gw.base}/healthz")).status_code == 200
        finally:
            for s in socks:
                s.close()
        with anyio.fail_after(10):
            while bystander.served < 5:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert bystander.failures == []


def _endless_head(port: int) -> int:
    """Bytes an endless request head got into the gateway before it was closed (at most 4 MiB)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((ATTACKER, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sent = 0
    try:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-endless: ")
        while sent < 4 * 2**20:
            sock.sendall(b"a" * 16384)
            sent += 16384
    except OSError:
        pass  # closed by the gateway
    finally:
        sock.close()
    return sent


async def test_endless_heads_are_refused_at_their_bound_while_a_bystander_is_served() -> None:
    server = {"server": {"connections": {"max_head_bytes": 16384}}}
    bystander = Bystander()
    sent: list[int] = []

    async def attack(port: int) -> None:
        sent.append(await anyio.to_thread.run_sync(_endless_head, port))

    async with gateway(server) as gw, client(gw.url) as c, anyio.create_task_group() as tg:
        tg.start_soon(bystander.run, c)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as attackers:
                for _ in range(20):
                    attackers.start_soon(attack, _port(gw.url))
        with anyio.fail_after(10):
            while bystander.served < 5:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    # Closed long before 4 MiB (before: every byte kept, gigabytes from a few connections).
    assert len(sent) == 20
    assert max(sent) < 4 * 2**20, sent
    assert bystander.failures == []


def _upgrade(port: int) -> bytes:
    """A WebSocket upgrade request from the attacker's address; the answer's status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0)) as sock:
        sock.sendall(
            b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        return sock.recv(4096).split(b"\r\n")[0]


def _health_from_attacker(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return sock.recv(4096).split(b"\r\n")[0]


async def test_upgrade_requests_leave_no_connection_counted() -> None:
    # An upgraded connection belonged to another protocol, which never gave its slot back:
    # past per_address upgrades, the address was refused for good.
    async with gateway({"server": {"connections": {"per_address": 20}}}) as gw:
        port = _port(gw.url)
        for _ in range(30):  # answered as plain HTTP (a GET accepting no event stream), not taken
            assert await anyio.to_thread.run_sync(_upgrade, port) == b"HTTP/1.1 406 Not Acceptable"
        assert await anyio.to_thread.run_sync(_health_from_attacker, port) == b"HTTP/1.1 200 OK"


def _upgrade_then_pipelined(port: int) -> bytes:
    """An upgrade request and a request pipelined after it; all the connection then gives."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0)) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        received = b""
        while chunk := sock.recv(65536):  # a timeout here: the connection was left open
            received += chunk
        return received


async def test_an_upgrade_request_is_answered_then_its_connection_closed_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # uvicorn's parser reads nothing after an upgrade request: the request pipelined after
    # it was dropped unanswered on a connection left open, and each upgrade logged two
    # warnings, as many as a client cared to send.
    caplog.set_level(logging.DEBUG)
    async with gateway({}) as gw:
        received = await anyio.to_thread.run_sync(_upgrade_then_pipelined, _port(gw.url))
    assert received.count(b"HTTP/1.1 200 OK") == 1  # the pipelined one is its client's to retry
    assert b"\r\nconnection: close\r\n" in received.lower()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any(r.getMessage() == f"ignored a protocol upgrade from {ATTACKER}" for r in caplog.records)


_CALL_IDS = itertools.count(2)
"""Each unread call's id: one session answers one request under an id at a time."""


def _big_answer_unread(port: int, session: str, megabytes: int, token: str | None = None) -> socket.socket:
    """A call for an answer of ``megabytes`` (twice that with its structured copy), on a
    connection whose client then reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
    sock.bind((ATTACKER, 0))
    sock.connect(("127.0.0.1", port))
    call = {
        "jsonrpc": "2.0",
        "id": next(_CALL_IDS),
        "method": "tools/call",
        "params": {"name": "echo__big", "arguments": {"megabytes": megabytes}},
    }
    body = json.dumps(call).encode()
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    head = "".join(f"{k}: {v}\r\n" for k, v in (HEADERS | auth | {"Mcp-Session-Id": session}).items())
    sock.sendall(
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body
    )
    return sock


async def test_a_client_that_never_reads_its_large_answer_lets_it_go_at_the_write_deadline() -> None:
    # Its unread answer (24 MiB once parsed) fills the client's share of the bound (25 MiB):
    # its next large answer is refused until the write deadline drops the unread one.
    server = {"server": {"max_bytes_in_flight": 50 * 2**20, "connections": {"write_timeout": 2}}}
    bystander = Bystander()
    async with (
        gateway(bearer({}) | server) as gw,
        client(gw.url, ATTACKER_TOKEN) as attacker,
        client(gw.url, BYSTANDER_TOKEN) as c,
        httpx.AsyncClient(timeout=10) as http,
    ):
        session = (await _open_session(http, gw.url, ATTACKER_TOKEN)).headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        auth = {"Authorization": f"Bearer {ATTACKER_TOKEN}", "Mcp-Session-Id": session}
        await http.post(gw.url, json=initialized, headers=HEADERS | auth)
        sock = await anyio.to_thread.run_sync(_big_answer_unread, _port(gw.url), session, 12, ATTACKER_TOKEN)
        answers: list[types.CallToolResult] = []
        try:
            await anyio.to_thread.run_sync(sock.recv, 1, socket.MSG_PEEK)  # its answer is being written
            async with anyio.create_task_group() as tg:
                tg.start_soon(bystander.run, c)
                with anyio.fail_after(15):
                    while not answers or answers[-1].is_error:  # before: refused for as long as it liked
                        answers.append(await attacker.call_tool("echo__big", {"megabytes": 5}))
                        await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
        finally:
            sock.close()
    assert "client 'attacker' holds 24 MiB" in str(answers[0].content[0])  # while the answer was held
    block = answers[-1].content[0]
    assert isinstance(block, types.TextContent)
    assert len(block.text) == 5 * 2**20
    assert bystander.failures == []


def _answer_begun(sock: socket.socket) -> bytes:
    """What a connection's client has been sent so far, once it is sent anything (unread)."""
    sock.settimeout(10)
    sock.recv(1, socket.MSG_PEEK)
    return sock.recv(65536, socket.MSG_PEEK)


async def test_one_client_holds_at_most_half_the_bound_on_answers_in_flight() -> None:
    # 64 MiB in all, 32 per client: three of the attacker's unread answers (10 MiB each once
    # parsed) fit its share, a fourth does not; the bystander's fits beside them.
    server = {"server": {"max_bytes_in_flight": 64 * 2**20}}
    async with (
        gateway(bearer({}) | server) as gw,
        client(gw.url, BYSTANDER_TOKEN) as c,
        httpx.AsyncClient(timeout=10) as http,
    ):
        opened = await _open_session(http, gw.url, ATTACKER_TOKEN)
        session = opened.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        auth = {"Authorization": f"Bearer {ATTACKER_TOKEN}", "Mcp-Session-Id": session}
        await http.post(gw.url, json=initialized, headers=HEADERS | auth)
        socks: list[socket.socket] = []
        try:
            begun: list[bytes] = []
            for _ in range(6):
                sock = await anyio.to_thread.run_sync(
                    _big_answer_unread, _port(gw.url), session, 5, ATTACKER_TOKEN
                )
                socks.append(sock)
                begun.append(await anyio.to_thread.run_sync(_answer_begun, sock))
            result = await c.call_tool("echo__big", {"megabytes": 5})  # before: refused
        finally:
            for sock in socks:
                sock.close()
    refusals = [b for b in begun if b"its share of the gateway's bound is 32 MiB" in b]
    assert len(refusals) == 3, [b[-300:] for b in begun]
    assert b"client 'attacker' holds 30 MiB of answers not yet written" in refusals[0]
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert len(block.text) == 5 * 2**20


# -- finding 2: one client fills the session table ---------------------------------------


async def _open_session(http: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    headers = HEADERS | {"Authorization": f"Bearer {token}"}
    return await http.post(url, json=INITIALIZE, headers=headers)


async def test_a_client_at_its_session_cap_holds_no_more_and_others_open_sessions() -> None:
    async with gateway(bearer({"max_sessions": 5})) as gw, httpx.AsyncClient(timeout=10) as http:
        answers = [await _open_session(http, gw.url, ATTACKER_TOKEN) for _ in range(8)]
        # At its cap, each new session ends the one it left idle the longest (all are idle
        # here): it never holds more than 5 (tests/security/test_session_room.py: a client
        # whose sessions are all busy is refused).
        assert [a.status_code for a in answers] == [200] * 8

        async def live() -> list[int]:
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            statuses = []
            for answer in answers:
                headers = HEADERS | {
                    "Authorization": f"Bearer {ATTACKER_TOKEN}",
                    "Mcp-Session-Id": answer.headers["mcp-session-id"],
                    "Mcp-Protocol-Version": INITIALIZE["params"]["protocolVersion"],  # type: ignore[index]
                }
                statuses.append((await http.post(gw.url, json=ping, headers=headers)).status_code)
            return statuses

        with anyio.fail_after(10):
            while await live() != [404] * 3 + [200] * 5:
                await anyio.sleep(0.05)
        # Others are not held up: the bystander opens sessions and calls tools.
        for _ in range(3):
            async with client(gw.url, BYSTANDER_TOKEN) as c:
                assert await echo(c) == "hi"


def _unread_initialize(port: int) -> socket.socket:
    """An initialize whose answer is never read, from a socket that takes little of it: the
    gateway is still writing the answer, its session already open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(INITIALIZE).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {ATTACKER_TOKEN}\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


async def test_a_session_whose_opening_answer_is_still_being_written_is_counted_once() -> None:
    # Counted as opening until its POST ended and as open from its handshake, a session
    # was counted twice meanwhile: a client opening several at once was refused short of its
    # max_sessions. Here the answers (16 MB of the gateway's instructions) are not read, so
    # that lasts.
    server = FastMCP("plain")
    server.tool(lambda text: text, name="echo")
    wordy = {"server": {"instructions": "x" * 16 * 2**20}}
    async with (
        serving_upstream(server) as url,
        running_gateway(
            {"upstreams": {"plain": {"url": url}}} | bearer({"max_sessions": 3}) | wordy,
            environ={"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN},
        ) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        port = _port(gw.url)
        socks = [await anyio.to_thread.run_sync(_unread_initialize, port) for _ in range(2)]
        try:
            with anyio.fail_after(10):
                while len(gw.gateway.sessions.live) < 2:
                    await anyio.sleep(0.02)
            third = await _open_session(http, gw.url, ATTACKER_TOKEN)
            fourth = await _open_session(http, gw.url, ATTACKER_TOKEN)
            # The cap still holds, three open: the third, idle, made way for the fourth (the
            # two whose answers are being written are busy, and were not ended).
            with anyio.fail_after(10):
                while third.headers["mcp-session-id"] in gw.gateway.sessions.live:
                    await anyio.sleep(0.02)
            live = len(gw.gateway.sessions.live)
        finally:
            for sock in socks:
                sock.close()
    assert third.status_code == 200, third.text
    assert fourth.status_code == 200, fourth.text
    assert live == 3


@pytest.mark.parametrize("trusted", [False, True], ids=["no-proxy-trusted", "loopback-trusted"])
async def test_a_client_names_its_own_address_only_from_a_trusted_proxy(
    caplog: pytest.LogCaptureFixture, trusted: bool
) -> None:
    # uvicorn trusts X-Forwarded-For from loopback by default: on the README's example any
    # local process naming a new address each request was a new anonymous client each time,
    # past its max_sessions, and no client the room could single out.
    caplog.set_level(logging.INFO)
    connections = {"trusted_proxies": ["127.0.0.1"]} if trusted else {}
    capped = {"auth": {"policies": {"default": {"max_sessions": 2}}}, "server": {"connections": connections}}
    async with gateway(capped) as gw, httpx.AsyncClient(timeout=10) as http:
        named = [HEADERS | {"X-Forwarded-For": f"10.0.0.{n}"} for n in range(3)]
        statuses = [
            (await http.post(gw.url, json=INITIALIZE, headers=headers)).status_code for headers in named
        ]
        live = len(gw.gateway.sessions.live)
    lines = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.refusals"]
    assert statuses == [200, 200, 200]  # idle sessions make way for their own client's new one
    if trusted:  # a proxy's word: three clients, one session each
        assert (live, lines) == (3, [])
    else:  # one client: its first session ended for its third
        assert live == 2
        [line] = lines
        assert "of anonymous@127.0.0.1, idle" in line, line
        assert line.endswith("to make way for a new one of anonymous@127.0.0.1 (its max_sessions 2)"), line


async def test_a_refusal_of_an_anonymous_client_names_its_address_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Anonymous clients are told apart by address: a line saying only "anonymous" could not
    # tell the operator which one to block.
    caplog.set_level(logging.INFO)
    capped = {"auth": {"policies": {"default": {"max_sessions": 2}}}}
    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER)
    async with gateway(capped) as gw, httpx.AsyncClient(transport=transport, timeout=10) as http:
        first, second = await opened(http, gw.url), await opened(http, gw.url)
        # Both busy (their streams open): neither is ended to make room, the third is refused.
        async with events(http, gw.url, first), events(http, gw.url, second):
            third = await http.post(gw.url, json=INITIALIZE, headers=HEADERS)
    assert third.status_code == 429
    lines = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.refusals"]
    assert lines == [f"client anonymous@{ATTACKER} refused a new session: 2 open, the limit is 2"]


MODERN = "2026-07-28"
LISTEN = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "subscriptions/listen",
    "params": {
        "notifications": {"toolsListChanged": True},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "attacker", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    },
}


async def _held_listen(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], release: anyio.Event, answers: list[bytes]
) -> None:
    """A raw modern ``subscriptions/listen`` stream, held open until ``release``; its first
    event (or its refusal) in ``answers``."""
    async with http.stream("POST", url, json=LISTEN, headers=headers) as answer:
        first = b""
        chunks = answer.aiter_raw()  # kept, not left: leaving its loop would close the stream
        while b"\r\n\r\n" not in first and not answer.is_closed:
            first += await anext(chunks, b"")
        answers.append(f"{answer.status_code} ".encode() + first)
        await release.wait()


async def test_a_clients_listen_streams_count_against_its_session_cap_while_others_listen() -> None:
    # A modern listen stream is a session while it is open, with or without an Mcp-Session-Id
    # (the era has none): one client's streams past max_sessions are refused, so it cannot
    # take the gateway's listen streams from everyone else.
    capped = {"auth": {"policies": {"default": {"max_sessions": 3}}}}
    headers = HEADERS | {"MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"}
    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER)
    release, answers = anyio.Event(), list[bytes]()
    async with (
        gateway(capped) as gw,
        httpx.AsyncClient(transport=transport, timeout=10) as http,
        anyio.create_task_group() as tg,
    ):
        for n in range(6):  # one at a time, each held before the next: none is refused early
            extra = {"Mcp-Session-Id": f"any-{n}"} if n % 2 else {}
            tg.start_soon(_held_listen, http, gw.url, headers | extra, release, answers)
            with anyio.fail_after(10):
                while len(answers) <= n:
                    await anyio.sleep(0.01)
        with anyio.fail_after(10):
            async with client(gw.url) as bystander, bystander.listen(tools_list_changed=True):
                pass  # acknowledged: its listen is served
        release.set()
    assert [a.split(b" ", 1)[0] for a in answers] == [b"200"] * 3 + [b"429"] * 3
    assert all(b"notifications/subscriptions/acknowledged" in a for a in answers[:3])
    assert all(b"has 3 sessions open, the limit (max_sessions)" in a for a in answers[3:])


async def _listen_until_ended(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], answers: list[bytes], ended: list[int]
) -> None:
    """A raw modern listen stream, read until the gateway ends it: its first event (or its
    refusal) in ``answers``, its number in ``ended`` once it has ended."""
    n = len(answers)
    async with http.stream("POST", url, json=LISTEN, headers=headers) as answer:
        first = b""
        async for chunk in answer.aiter_raw():
            if b"\r\n\r\n" not in first:
                first += chunk
                if b"\r\n\r\n" in first:
                    answers.append(f"{answer.status_code} ".encode() + first)
        if b"\r\n\r\n" not in first:
            answers.append(f"{answer.status_code} ".encode() + first)
    ended.append(n)


async def test_at_the_listen_stream_bound_a_newcomer_takes_the_place_of_the_largest_holders_oldest() -> None:
    # The gateway's listen streams were capped with no share: clients from a few addresses,
    # each within its own max_sessions, held them all and every other client was refused.
    headers = HEADERS | {"MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"}
    answers, ended = list[bytes](), list[int]()
    async with (
        gateway({"server": {"max_listen_streams": 4}}) as gw,
        httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=ATTACKER), timeout=10) as http,
        anyio.create_task_group() as tg,
    ):
        for n in range(4):  # the attacker holds every stream, one opened after another
            tg.start_soon(_listen_until_ended, http, gw.url, headers, answers, ended)
            with anyio.fail_after(10):
                while len(answers) <= n:
                    await anyio.sleep(0.01)
        # A listen that fails (it names no resource the gateway has) ends no one's stream.
        unknown = LISTEN | {
            "params": LISTEN["params"] | {"notifications": {"resourceSubscriptions": ["no://such"]}}
        }
        async with httpx.AsyncClient(timeout=10) as other:
            failed = await other.post(gw.url, json=unknown, headers=headers)
        assert b"listen stream limit reached" not in failed.content
        assert ended == []
        with anyio.fail_after(10):
            async with client(gw.url) as bystander, bystander.listen(tools_list_changed=True):
                # Its listen is served; the attacker's oldest stream ended to make way.
                while ended != [0]:
                    await anyio.sleep(0.01)
                # The attacker's next is refused: it holds the most already.
                tg.start_soon(_listen_until_ended, http, gw.url, headers, answers, ended)
                while len(answers) < 5:
                    await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert all(a.startswith(b"200 ") and b"subscriptions/acknowledged" in a for a in answers[:4])
    assert b"listen stream limit reached" in answers[4]


async def test_initialize_and_notifications_are_counted_by_the_rate_limit() -> None:
    limited = bearer({"rate_limit": {"per_minute": 6, "burst": 3}})
    async with gateway(limited) as gw, httpx.AsyncClient(timeout=10) as http:
        answers = [await _open_session(http, gw.url, ATTACKER_TOKEN) for _ in range(5)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
        assert "rate limit exceeded for client 'attacker'" in answers[-1].json()["error"]["message"]
        assert answers[-1].headers["retry-after"]
        # And in the error itself, for a client that reads only the JSON-RPC answer.
        assert answers[-1].json()["error"]["data"]["retryAfterSeconds"] > 0
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        headers = HEADERS | {
            "Authorization": f"Bearer {ATTACKER_TOKEN}",
            "Mcp-Session-Id": answers[0].headers["mcp-session-id"],
        }
        assert (await http.post(gw.url, json=note, headers=headers)).status_code == 429
        async with client(gw.url, BYSTANDER_TOKEN) as c:
            assert await echo(c) == "hi"


# -- finding 4: long names ---------------------------------------------------------------


async def test_names_over_64_characters_are_refused_and_no_log_line_holds_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    restricted = bearer({"tools": ["echo__*"]})
    caplog.set_level(logging.DEBUG)
    async with gateway(restricted) as gw, client(gw.url, ATTACKER_TOKEN) as c:
        for n in range(20):  # a modern client sends the name in a header too: within the head's bound
            name = f"{n:02d}" + "x" * 49_998
            with pytest.raises(MCPError, match=r"name is 50000 characters long; public names are at most 64"):
                await c.call_tool(name, {})
        async with client(gw.url, BYSTANDER_TOKEN) as other:
            assert await echo(other) == "hi"
    # The gateway's side (the test's own client logs what it sends in full).
    served = [r for r in caplog.records if not r.name.startswith(("mcp.client", "httpx"))]
    longest = max(len(r.getMessage()) for r in served)
    assert longest < 2_000, longest


# -- finding 5: large bodies -------------------------------------------------------------


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_arguments_nested_past_128_levels_are_refused_before_anything_reads_them(mode: str) -> None:
    # Past 255 levels the SDK's models failed to serialise them: answered with code 0 and a
    # traceback logged for each (eight clients: 0.7 MB of log a second), and a FastMCP
    # upstream never answered arguments 200 deep.
    seen: list[str] = []
    server = FastMCP("deep")

    @server.tool
    def keep(value: Any) -> str:
        seen.append(json.dumps(value)[:20])
        return "kept"

    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"deep": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as c,
    ):
        with pytest.raises(MCPError, match="nested too deeply"):
            await c.call_tool("deep__keep", {"value": nested(200)})
        # The envelope (message, params, arguments) and 120 levels of arguments: within the bound.
        assert (await c.call_tool("deep__keep", {"value": nested(120)})).structured_content == {
            "result": "kept"
        }
    assert seen == [json.dumps(nested(120))[:20]]


async def test_a_body_of_a_million_values_is_refused_unparsed() -> None:
    async with gateway({}) as gw, client(gw.url) as c, httpx.AsyncClient(timeout=30) as http:
        session = await _open_session(http, gw.url, "unused")
        sid = session.headers["mcp-session-id"]
        flood = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": [{}] * 1_000_000}}
        body = json.dumps(flood, separators=(",", ":")).encode()
        answer = await http.post(gw.url, content=body, headers=HEADERS | {"Mcp-Session-Id": sid})
        assert answer.status_code == 400
        assert "the limit (server.max_body_elements) is 100000" in answer.json()["error"]["message"]
        # Punctuation inside text is not values: an argument with 125,000 of it passes whole.
        text = "a, b, {c}, [d]; " * 31_250
        assert (
            hashlib.sha256((await echo(c, text)).encode()).digest() == hashlib.sha256(text.encode()).digest()
        )
        # Past the bound, an unclosed string of escaped quotes is counted in one pass (the count
        # once retried from every quote: quadratic, minutes of the event loop for this body).
        # The gateway shares this test's event loop, which a stall holds: the bound is checked
        # once it lets go (the count takes milliseconds; the quadratic one took about a minute).
        stall = b"," * 100_001 + b'"' + b'\\"' * 60_000
        started = time.monotonic()
        refused = await http.post(gw.url, content=stall, headers=HEADERS | {"Mcp-Session-Id": sid})
        assert refused.status_code == 400
        assert time.monotonic() - started < 20  # a hang's bound, not a speed
