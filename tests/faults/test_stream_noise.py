"""An upstream's stream that sends what makes no message (``compat/http_streams.py``,
``QUIET_BYTES``): comments without end took most of a core from the gateway with no call in
flight. Each upstream here is FastMCP whose session's own stream (its GET) the test writes."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.noise import QUIET_BYTES
from tests.faults.harness import text_of
from tests.support import running_gateway, serving

WAIT = 20.0
SSE = [(b"content-type", b"text/event-stream")]
CHANGED = b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n\n'


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.02)


@dataclass
class Listened:
    """What the upstream saw of its session's own streams."""

    opened: int = 0
    sent: list[int] = field(default_factory=list[int])
    """Bytes sent on each stream the gateway ended (closed from its side)."""
    listings: int = 0
    """``tools/list`` requests: the gateway lists again when told the tools changed."""


Body = Callable[[bytes], Awaitable[None]]
Writer = Callable[[Body, Listened], Awaitable[None]]
"""Writes the body of one GET stream (until the gateway closes it)."""


def noisy(server: FastMCP, listened: Listened, write: Writer) -> ASGIApp:
    """``server`` over Streamable HTTP, each GET of its session's own stream written by ``write``."""
    app = server.http_app(path="/mcp")

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            if scope["type"] == "http" and scope["method"] == "POST":
                receive = await counting(receive, listened)
            return await app(scope, receive, send)
        listened.opened += 1
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        counted = [0]

        async def body(data: bytes) -> None:
            counted[0] += len(data)
            await send({"type": "http.response.body", "body": data, "more_body": True})

        async with anyio.create_task_group() as tg:

            async def writing() -> None:
                await write(body, listened)
                await anyio.sleep_forever()

            tg.start_soon(writing)
            while (await receive())["type"] != "http.disconnect":
                pass
            listened.sent.append(counted[0])
            tg.cancel_scope.cancel()

    return upstream


async def counting(receive: Receive, listened: Listened) -> Receive:
    """``receive`` with the POST's body read first, its ``tools/list`` counted."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if json.loads(body).get("method") == "tools/list":
        listened.listings += 1
    unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return unread.pop() if unread else await receive()

    return replayed


def kit() -> FastMCP:
    server = FastMCP("kit")
    server.tool(lambda: "pong", name="ping")
    return server


FLOOD = 64 * 2**20
"""Bytes of comments an upstream offers on one stream: read whole, no bound ended it."""


async def comments(body: Body, listened: Listened) -> None:
    chunk = b":\n" * 32768
    for _ in range(FLOOD // len(chunk)):
        await body(chunk)


async def unreadable_between(body: Body, listened: Listened) -> None:
    """Comments, each batch after an event whose data is no message (it reset the count)."""
    chunk = b"event: message\ndata: not json\n\n" + b":\n" * 16384
    for _ in range(FLOOD // len(chunk)):
        await body(chunk)


@pytest.mark.parametrize("write", [comments, unreadable_between], ids=["comments", "unreadable-between"])
async def test_a_stream_of_nothing_but_comments_is_ended_and_reopened(
    caplog: pytest.LogCaptureFixture, write: Writer
) -> None:
    # Read on (no bound counts what makes no message), the comments took 88 % of a core; an
    # event whose data was no message, every 32 KiB of them, reset the count.
    listened = Listened()
    async with serving(noisy(kit(), listened, write)) as base:
        upstream = {"url": f"{base}/mcp", "protocol": "legacy"}
        async with running_gateway({"upstreams": {"up": upstream}}) as gw, Client(gw.url) as client:
            await until(lambda: len(listened.sent) >= 2 and listened.opened >= 3)
            pong = await client.call_tool("up__ping", {})
    assert text_of(pong) == "pong"
    # Ended near QUIET_BYTES, not at FLOOD: the socket buffers hold a few MiB more (4.1 MiB
    # of comments were once sent), and the SDK's traceback for each unreadable event more.
    assert max(listened.sent) < FLOOD // 4, listened.sent
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "made no message" in r.message]
    assert len(warned) == 1, warned  # once, however often it is ended
    assert "up" in warned[0].message


async def keep_alives(body: Body, listened: Listened) -> None:
    """Comments under the bound, a message, more, a message: what a keep-alive looks like."""
    pad = b":\n" * (QUIET_BYTES * 3 // 8)  # three quarters of the bound
    await until(lambda: listened.listings > 0)  # the gateway's own first listing
    for _ in range(2):
        await body(pad)
        at = listened.listings
        await body(CHANGED)
        await until(lambda at=at: listened.listings > at)  # the gateway read it: it listed again


async def test_comments_under_the_bound_between_messages_leave_the_stream_open() -> None:
    listened = Listened()
    async with serving(noisy(kit(), listened, keep_alives)) as base:
        upstream = {"url": f"{base}/mcp", "protocol": "legacy"}
        async with running_gateway({"upstreams": {"up": upstream}}) as gw, Client(gw.url) as client:
            await until(lambda: listened.listings >= 3)  # the first listing, then one per message
            pong = await client.call_tool("up__ping", {})
            assert (listened.opened, listened.sent) == (1, [])
    assert text_of(pong) == "pong"


def dripping(server: FastMCP, sent: list[int]) -> ASGIApp:
    """``server`` over Streamable HTTP, but a call of its tool ``drip`` answered by a stream of
    comments without end (the bytes written before the gateway let go of it kept in ``sent``)."""
    app = server.http_app(path="/mcp")

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if json.loads(body).get("params", {}).get("name") != "drip":
            unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

            async def replayed() -> Message:
                return unread.pop() if unread else await receive()

            return await app(scope, replayed, send)
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        chunk, written = b":\n" * 32768, [0]

        async def writing() -> None:
            while written[0] < FLOOD:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                written[0] += len(chunk)
            await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(writing)
            with anyio.move_on_after(WAIT):  # the test's own bound
                while (await receive())["type"] != "http.disconnect":
                    pass
            sent.append(written[0])  # when the gateway let go of the stream
            tg.cancel_scope.cancel()

    return upstream


async def test_a_calls_answer_stream_of_nothing_but_comments_fails_the_call_and_a_bystander_is_served() -> (
    None
):
    # The forwarder read a modern call's answer stream through httpx2's EventSource: comments
    # without end were parsed until the call's timeout (60 s here), all the while using the
    # gateway's CPU, and every call of the tool did the same.
    server, sent = kit(), list[int]()
    server.tool(lambda: "never", name="drip")
    async with serving(dripping(server, sent)) as base:
        upstream = {"url": f"{base}/mcp", "protocol": "2026-07-28", "timeout": 60}
        async with running_gateway({"upstreams": {"up": upstream}}) as gw, Client(gw.url) as client:
            with anyio.fail_after(WAIT):
                dripped = await client.call_tool("up__drip", {})
                pong = await client.call_tool("up__ping", {})
    assert dripped.is_error
    assert "made no message" in text_of(dripped), text_of(dripped)
    assert text_of(pong) == "pong"
    with anyio.fail_after(WAIT):
        while not sent:  # the upstream's writes end once the gateway has let go of the stream
            await anyio.sleep(0.02)
    assert sent[0] < FLOOD // 4, sent  # let go (the socket buffers hold a few MiB more), not read on
