"""What a handshake-era upstream's answer streams may cost the gateway (``compat/http_streams.py``):
a call given up lets its stream go, and streams that end at once are not reopened in a loop.
Each upstream here is FastMCP behind an ASGI wrapper that records what reaches it."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.compat import http_streams
from tests.faults.harness import text_of
from tests.support import running_gateway, serving

WAIT = 20.0
SSE = [(b"content-type", b"text/event-stream")]


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.02)


class Recorded:
    """What the upstream saw, in order, and when each stream was opened."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.stormed: list[float] = []
        """When each stream of a ``storm`` call was asked for: its POST, then each resumption."""
        self.listened: list[float] = []
        """When each GET of the session's own stream arrived (resumed or not)."""


def recording(server: FastMCP, recorded: Recorded, listen_ends: bool = False) -> ASGIApp:
    """``server`` over Streamable HTTP, its ``drip`` calls answered with a stream that never
    ends (a comment every 50 ms), its ``storm`` calls with one that ends at once after an
    event id and ``retry: 0``; every resumption of it ends at once the same way. With
    ``listen_ends`` the session's own stream (a GET) does too."""
    app = server.http_app(path="/mcp")
    ids = itertools.count()

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = dict(scope["headers"])
        if scope["method"] == "GET" and (b"last-event-id" in headers or listen_ends):
            (recorded.listened if listen_ends else recorded.stormed).append(time.monotonic())
            return await _ended_at_once(send, b"id: r%d\nretry: 0\n\n" % next(ids))
        if scope["method"] != "POST":
            return await app(scope, receive, send)
        body = await _body(receive)
        request = json.loads(body)
        name = (request.get("params") or {}).get("name")
        if request.get("method") == "notifications/cancelled":
            recorded.seen.append("cancelled")
        if name == "drip":
            return await _drip(receive, send, recorded)
        if name == "storm":
            recorded.stormed.append(time.monotonic())
            return await _ended_at_once(send, b"id: p1\nretry: 0\ndata: \n\n")
        unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return unread.pop() if unread else await receive()

        return await app(scope, replayed, send)

    return upstream


async def _body(receive: Receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    return body


async def _drip(receive: Receive, send: Send, recorded: Recorded) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    async with anyio.create_task_group() as tg:

        async def drip() -> None:
            while True:
                await send({"type": "http.response.body", "body": b": drip\n\n", "more_body": True})
                await anyio.sleep(0.05)

        tg.start_soon(drip)
        while (await receive())["type"] != "http.disconnect":
            pass
        recorded.seen.append("disconnected")
        tg.cancel_scope.cancel()


async def _ended_at_once(send: Send, events: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": events, "more_body": False})


def storming_server() -> FastMCP:
    server = FastMCP("storming")
    server.tool(lambda: "never sent", name="drip")
    server.tool(lambda: "never sent", name="storm")
    server.tool(lambda: "pong", name="ping")
    return server


@asynccontextmanager
async def storming(
    recorded: Recorded, call_timeout: float, listen_ends: bool = False
) -> AsyncIterator[Client]:
    """A client of a gateway whose one upstream (``up``, handshake era, calls bounded by
    ``call_timeout``) is ``storming_server`` behind ``recording``."""
    upstream = recording(storming_server(), recorded, listen_ends)
    async with serving(upstream) as base:
        config = {"upstreams": {"up": {"url": f"{base}/mcp", "protocol": "legacy", "timeout": call_timeout}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            yield client


async def test_a_handshake_era_call_given_up_closes_its_answer_stream_after_cancelling_it() -> None:
    # The SDK sent the cancel and read on until the upstream ended the stream: every call
    # timed out against an upstream that drips kept a POST, a connection and a task.
    recorded = Recorded()
    async with storming(recorded, 1) as client:
        result = await client.call_tool("up__drip", {})
        await until(lambda: "disconnected" in recorded.seen)
        pong = await client.call_tool("up__ping", {})
    assert result.is_error
    assert "no answer within 1s" in text_of(result)
    assert recorded.seen == ["cancelled", "disconnected"]  # the cancel first: it is the signal
    assert text_of(pong) == "pong"


async def test_an_answer_stream_ended_at_once_with_retry_zero_is_reopened_once_a_second() -> None:
    # Honoured as the upstream asked, 16 such calls made 46,000 GETs in 45 s.
    recorded = Recorded()
    async with storming(recorded, 3.5) as client:
        result = await client.call_tool("up__storm", {})
        pong = await client.call_tool("up__ping", {})
    assert result.is_error
    assert "no answer within 3.5s" in text_of(result)
    assert len(recorded.stormed) >= 3, recorded.stormed
    gaps = [later - earlier for earlier, later in itertools.pairwise(recorded.stormed)]
    assert min(gaps) >= http_streams.RETRY_FLOOR_MS / 1000 * 0.9, gaps
    assert text_of(pong) == "pong"


async def test_the_sessions_own_stream_ended_at_once_with_retry_zero_is_reopened_once_a_second() -> None:
    recorded = Recorded()
    async with storming(recorded, 5, listen_ends=True) as client:
        await until(lambda: len(recorded.listened) >= 3)
        pong = await client.call_tool("up__ping", {})
    gaps = [later - earlier for earlier, later in itertools.pairwise(recorded.listened)]
    assert min(gaps) >= http_streams.RETRY_FLOOR_MS / 1000 * 0.9, gaps
    assert text_of(pong) == "pong"


async def test_a_request_whose_stream_keeps_ending_fails_saying_so_after_max_resumptions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK resumes by recursion, one frame deeper each time: unbounded, a long call's
    # stream could be reopened until the interpreter's recursion limit.
    monkeypatch.setattr(http_streams, "MAX_RESUMPTIONS", 3)
    monkeypatch.setattr(http_streams, "RETRY_FLOOR_MS", 10)
    recorded = Recorded()
    async with storming(recorded, 30) as client:
        result = await client.call_tool("up__storm", {})
    assert result.is_error
    assert "the upstream ended this answer's stream 3 times without the answer" in text_of(result)
    assert len(recorded.stormed) == 1 + 3  # the call's POST, then three resumptions
