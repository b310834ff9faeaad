"""Requests other than POSTs carry no body (MCP's GET and DELETE have none). The SDK read any
request's body whole before looking at its method or its session, past admission (which reads
POSTs only): with no deadline, and uncounted in the bytes in flight. One client's 100 GETs,
each sending 4 MiB of a body, took the gateway from 170 to 654 MB for as long as it kept
their connections open (512 an address); a body sent a byte a second was read for ever.
Found by a helper's attack on the HTTP front door."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from fastmcp import FastMCP

from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, HEADERS, INITIALIZE, client
from tests.support import RunningGateway, running_gateway, serving_upstream

WAIT = 20.0
DECLARED = 4 * 2**20
SENT = 1024
"""What is sent of it: read with the head (more, and the gateway's close, body unread, resets
the connection, which may reach the client before the answer)."""


def _library() -> FastMCP:
    server = FastMCP("library")

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


@asynccontextmanager
async def _gateway(**connections: float) -> AsyncIterator[RunningGateway]:
    async with serving_upstream(_library()) as url:
        config = {
            "server": {"connections": connections},
            "upstreams": {"library": {"url": url}},
            "auth": {
                "mode": "bearer",
                "tokens": [
                    {"name": "bystander", "token": "${B}", "policy": "all"},
                    {"name": "attacker", "token": "${A}", "policy": "all"},
                ],
                "policies": {"all": {"tools": ["library__*"]}},
            },
        }
        async with running_gateway(config, environ={"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}) as gw:
            yield gw


async def _unfinished_body(
    url: str, method: str, framing: str, token: str | None = ATTACKER_TOKEN, body: bytes | None = None
) -> tuple[Any, Any]:
    """A ``method`` request from the attacker with a body it never finishes: ``SENT`` bytes of
    ``DECLARED`` (``Content-Length``), or one chunk of ``SENT`` bytes (chunked), or ``body``."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    framed = f"Content-Length: {DECLARED}" if framing == "length" else "Transfer-Encoding: chunked"
    credential = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    head = (
        f"{method} {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{credential}"
        f"Accept: text/event-stream\r\nMcp-Session-Id: {'a' * 32}\r\n{framed}\r\n\r\n"
    )
    if body is None:
        body = b" " * SENT if framing == "length" else f"{SENT:x}\r\n".encode() + b" " * SENT + b"\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


async def _answer_of(reader: Any) -> bytes:
    """What the gateway answered before it closed the connection."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_request_other_than_a_post_carrying_a_body_is_refused_unread(
    method: str, framing: str
) -> None:
    async with _gateway() as gw, client(gw.url, BYSTANDER_TOKEN) as bystander:
        held = [await _unfinished_body(gw.url, method, framing) for _ in range(3)]
        try:
            with anyio.fail_after(WAIT):  # before: never answered, the SDK reading the body on
                answers = [await _answer_of(reader) for reader, _ in held]  # and the connection closed
            served = await bystander.call_tool("library__echo", {"text": "y"})
        finally:
            for _, writer in held:
                writer.close()
    assert all(answer.startswith(b"HTTP/1.1 400") for answer in answers), [a[:200] for a in answers]
    assert f"a {method} request carries no body".encode() in answers[0]
    assert not served.is_error


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
async def test_an_unauthenticated_chunked_request_is_refused_at_once_and_closed_not_after_its_bodys_deadline(
    method: str,
) -> None:
    # Before, a GET's or DELETE's first chunk was waited for (body_timeout, here far past the
    # wait), then refused 400; any method's 401 kept the connection for the rest of the body
    # until the next head's deadline or the keep-alive's end (here far past it too).
    # The head, then a chunk's size line begun and never ended (a trickle's first byte).
    await _twenty_unauthenticated_are_answered_401(method, "chunked", b"1")


async def _session(url: str) -> str:
    """A session opened by the attacker's raw initialize: its id."""
    headers = {"Authorization": f"Bearer {ATTACKER_TOKEN}", **HEADERS}
    async with httpx.AsyncClient(timeout=WAIT) as http:
        opened = await http.post(url, json=INITIALIZE, headers=headers)
    assert opened.status_code == 200, opened.text
    return opened.headers["mcp-session-id"]


async def _delete(url: str, session: str, framing: str) -> bytes:
    """The answer's head to a DELETE of ``session`` with an empty body, framed as ``framing``
    says (some client libraries send one for a request they were given an empty stream for)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    framed, body = (
        ("Content-Length: 0", b"") if framing == "length" else ("Transfer-Encoding: chunked", b"0\r\n\r\n")
    )
    head = (
        f"DELETE {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {ATTACKER_TOKEN}\r\n"
        f"Mcp-Session-Id: {session}\r\n{framed}\r\n\r\n"
    )
    try:
        writer.write(head.encode())
        await writer.drain()
        writer.write(body)  # the end of the body after the head, as a streaming client sends it
        with anyio.fail_after(WAIT):
            return await reader.readuntil(b"\r\n\r\n")
    finally:
        writer.close()


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_delete_with_an_empty_body_ends_its_session(framing: str) -> None:
    async with _gateway() as gw, client(gw.url, BYSTANDER_TOKEN) as bystander:
        session = await _session(gw.url)
        answer = await _delete(gw.url, session, framing)  # before (chunked): 400, carries no body
        served = await bystander.call_tool("library__echo", {"text": "y"})
        async with httpx.AsyncClient(timeout=WAIT) as http:
            after = await http.post(
                gw.url,
                json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                headers={"Authorization": f"Bearer {ATTACKER_TOKEN}", "Mcp-Session-Id": session, **HEADERS},
            )
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert after.status_code == 404, after.text  # the session is gone
    assert not served.is_error


@pytest.mark.parametrize("size", [64 << 10, 4 << 20], ids=["64KiB", "4MiB"])
async def test_a_post_whose_token_is_refused_gets_its_401_whatever_its_bodys_size(size: int) -> None:
    # A client whose token expired learns it from the 401 (and refreshes it): the answer must
    # reach it while it is still sending its body, not a reset connection in its place.
    # Sent 64 KiB at a time, as over a network: still being sent when the 401 is ready, as it
    # would be over anything slower than loopback (sent at once, it sometimes was all sent).
    async def uploaded() -> AsyncIterator[bytes]:
        for _ in range(size >> 16):
            yield b" " * (1 << 16)
            await anyio.sleep(0.005)

    async with _gateway() as gw, httpx.AsyncClient(timeout=WAIT) as http:
        headers = {**HEADERS, "Authorization": "Bearer expired-or-wrong", "Content-Length": str(size)}
        answer = await http.post(gw.url, content=uploaded(), headers=headers)
    assert answer.status_code == 401, answer.text


async def test_an_unauthenticated_trickle_of_a_declared_body_is_answered_and_closed_within_its_drain() -> (
    None
):
    # A declared body a 401 waits for (its client may be mid-send) is given DRAIN_WITHIN, not
    # the connection's deadlines: a trickle is answered and closed then, a bystander served.
    await _twenty_unauthenticated_are_answered_401("POST", "length", b" ")


async def _twenty_unauthenticated_are_answered_401(method: str, framing: str, first: bytes) -> None:
    """Twenty unauthenticated requests whose bodies stop after ``first`` are each answered 401
    to their connection's end (within the test's wait, far short of the connection's own
    deadlines), and a bystander is served meanwhile."""
    slow = {"body_timeout": 600, "header_timeout": 600, "keep_alive_timeout": 3600}
    async with _gateway(**slow) as gw, client(gw.url, BYSTANDER_TOKEN) as bystander:
        held = [await _unfinished_body(gw.url, method, framing, None, first) for _ in range(20)]
        try:
            with anyio.fail_after(WAIT):
                answers = [await _answer_of(reader) for reader, _ in held]  # to the connection's end
            served = await bystander.call_tool("library__echo", {"text": "y"})
        finally:
            for _, writer in held:
                writer.close()
    assert all(answer.startswith(b"HTTP/1.1 401") for answer in answers), [a[:200] for a in answers]
    assert not served.is_error


async def test_an_addresss_unauthenticated_bodies_being_drained_hold_up_none_of_its_other_requests() -> None:
    # A declared body before a 401 was drained (DRAIN_WITHIN, 2 s) within its address's
    # working turn: eight such trickles held all four of its turns, and the address's
    # /healthz (a probe's; its OAuth metadata, a 401 telling a client its token expired)
    # waited for them, 5 s (TURN_WAIT), where a probe gives up after 1 s. The drain is the
    # client's time on the network, not work of the gateway's: the turn is taken after it.
    slow = {"body_timeout": 600, "header_timeout": 600, "keep_alive_timeout": 3600}
    order: list[str] = []
    async with _gateway(**slow) as gw, client(gw.url, BYSTANDER_TOKEN) as bystander:
        held = [await _unfinished_body(gw.url, "POST", "length", None, b" ") for _ in range(8)]
        try:
            # Sent after the trickles' heads, and answered after the gateway read them (in
            # the turns of the loop it takes), by another client: served at once all along.
            served = await bystander.call_tool("library__echo", {"text": "y"})
            held.append(probe := await _health_probe(gw.base))
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    for reader, _ in held[:-1]:
                        tg.start_soon(_noted, reader, "HTTP/1.1 401", "trickle", order)
                    tg.start_soon(_noted, probe[0], "HTTP/1.1 200", "probe", order)
        finally:
            for _, writer in held:
                writer.close()
    assert not served.is_error
    assert order[0] == "probe", order  # before: four trickles' 401s at 2 s, the probe's at 5 s
    assert order.count("trickle") == 8, order


async def _noted(reader: Any, expected: str, name: str, order: list[str]) -> None:
    """``name`` noted in ``order`` once the gateway has answered on ``reader`` and closed it
    (what it answered, if it is not ``expected``)."""
    answer = await _answer_of(reader)
    order.append(name if answer.startswith(expected.encode()) else f"{name}: {answer[:100]!r}")


async def _health_probe(base: str) -> tuple[Any, Any]:
    """A ``/healthz`` from the trickles' address, without a token, as a probe asks it."""
    parts = urlsplit(base)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(f"GET /healthz HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    return reader, writer
