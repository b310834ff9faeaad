"""What a legacy SSE upstream's stream (``transport: sse``) says besides its messages: its
``endpoint`` events (one refused, one repeated) and events of types the transport does not
define, through a running gateway with the official client downstream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.support import RunningGateway, running_gateway, serving
from tests.test_sse_upstream import BOUND, Written, hostile, kept, kit_server, passed, text_of, wait_until

Edit = Callable[[bytes], list[bytes]]
"""Given each chunk of the stream's body (one event each): the chunks sent in its place."""


def edited(app: ASGIApp, edit: Edit) -> ASGIApp:
    """``app`` (FastMCP's legacy SSE app), each event its stream sends passed through ``edit``."""

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            return await app(scope, receive, send)

        async def sending(message: Message) -> None:
            if message["type"] != "http.response.body" or not message.get("body"):
                return await send(message)
            for body in edit(message["body"]):
                await send({"type": "http.response.body", "body": body, "more_body": True})

        return await app(scope, receive, sending)

    return upstream


@asynccontextmanager
async def sse_gateway(edit: Edit, connect_timeout: float = 60) -> AsyncIterator[RunningGateway]:
    app = edited(hostile(kit_server().http_app(transport="sse", path="/sse"), passed, kept), edit)
    async with serving(app) as base:
        upstream = {"url": f"{base}/sse", "transport": "sse", "protocol": "legacy"}
        upstream |= {"connect_timeout": connect_timeout, "retry": {"initial_delay": 0.05, "max_delay": 0.1}}
        async with running_gateway({"upstreams": {"kit": upstream}}, settle_timeout=BOUND) as gw:
            yield gw


@asynccontextmanager
async def written() -> AsyncIterator[Written]:
    """The WARNING lines (and above) of every logger, as the CLI's handler writes them: level,
    logger, message (and a traceback)."""
    handler = Written()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


# -- the endpoint event ------------------------------------------------------------------------


def endpoint(data: bytes) -> Edit:
    def edit(body: bytes) -> list[bytes]:
        if body.startswith(b"event: endpoint"):
            return [b"event: endpoint\r\ndata: " + data + b"\r\n\r\n"]
        return [body]

    return edit


REFUSED = {
    "another-origin": (
        b"http://evil.invalid/messages/?session_id=secret",
        "names http://evil.invalid/messages/",
    ),
    "no-url": (b"http://[::1/messages/", "names no URL it can be read as"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
async def test_a_refused_endpoint_event_fails_the_connect_at_once_saying_why(kind: str) -> None:
    # The SDK's reader sent its error to a stream nobody read yet: the connect waited out
    # connect_timeout (60 s), then said "no answer", after an ERROR traceback.
    # Two connects refused within BOUND, each far inside connect_timeout: the proof that
    # neither waited it out (no timing asserted: a loaded machine starts the gateway slowly).
    data, reason = REFUSED[kind]
    async with written() as lines, sse_gateway(endpoint(data)) as gw:
        upstream = gw.gateway.pool.get("kit")
        # Retried, and seen down between retries (it goes on retrying: "connecting" a moment later).
        await wait_until(
            lambda: sum("is down" in line for line in lines.lines) >= 2 and str(upstream.state) == "down"
        )
    assert upstream.last_error is not None
    assert reason in upstream.last_error, upstream.last_error
    assert "secret" not in upstream.last_error
    assert all(line.startswith("WARNING agent_gateway.upstreams.") for line in lines.lines), lines.lines
    assert "Traceback" not in "\n".join(lines.lines)


def endpoint_twice(body: bytes) -> list[bytes]:
    if body.startswith(b"event: endpoint"):
        return [body, b"event: endpoint\r\ndata: /elsewhere/\r\n\r\n"]
    return [body]


async def test_a_second_endpoint_event_is_ignored_and_the_first_kept() -> None:
    # The SDK's reader "started" twice, and the connection dropped: the upstream never came up.
    async with written() as lines, sse_gateway(endpoint_twice) as gw, Client(gw.url) as client:
        with anyio.fail_after(BOUND):
            answered = await client.call_tool("kit__weather", {"city": "Oslo"})
        upstream = gw.gateway.pool.get("kit")
    assert text_of(answered) == "sunny in Oslo"  # its POST went to the first endpoint
    assert upstream.connections == 1
    [line] = [line for line in lines.lines if "endpoint" in line]
    assert "sent another endpoint event (/elsewhere/): ignored" in line


# -- events of other types ---------------------------------------------------------------------


def renamed(event: bytes, needle: bytes) -> Edit:
    """Each message event holding ``needle`` sent as an event of type ``event``."""

    def edit(body: bytes) -> list[bytes]:
        if body.startswith(b"event: message") and needle in body:
            return [body.replace(b"event: message", b"event: " + event, 1)]
        return [body]

    return edit


async def test_an_answer_under_another_event_type_fails_its_call_at_once() -> None:
    # The SDK's reader dropped it (a warning naming no upstream): the call waited its timeout.
    async with written() as lines, sse_gateway(renamed(b"answer", b"sunny in Oslo")) as gw:
        async with Client(gw.url) as client:
            with anyio.fail_after(BOUND):
                failed = await client.call_tool("kit__weather", {"city": "Oslo"})
            after = await client.call_tool("kit__ping", {})
        upstream = gw.gateway.pool.get("kit")
    assert failed.is_error
    assert "an SSE event of type 'answer', not 'message'" in text_of(failed), text_of(failed)
    assert text_of(after) == "pong"
    assert upstream.connections == 1  # the session went on
    [line] = [line for line in lines.lines if "'answer'" in line]
    assert "upstream session kit/" in line


def heartbeats(body: bytes) -> list[bytes]:
    """Each event followed by one of a type of the server's own, named past any bound."""
    return [body, b"event: heartbeat" + b"-" * 1000 + b"\r\ndata: {}\r\n\r\n"]


async def test_events_of_other_types_are_ignored_with_one_bounded_warning() -> None:
    async with written() as lines, sse_gateway(heartbeats) as gw, Client(gw.url) as client:
        for _ in range(5):
            with anyio.fail_after(BOUND):
                assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    [line] = [line for line in lines.lines if "heartbeat" in line]
    assert "an SSE event of type 'heartbeat---" in line
    assert len(line) < 400
