"""A hostile legacy SSE upstream (``transport: sse``, the 2024-11-05 HTTP+SSE transport):
FastMCP's own legacy SSE app behind a layer that misbehaves on the calls a test picks (a
POST answered with an error status, an endless body or a flood of cookies; an answer on
the stream rewritten), through a running gateway with the official client downstream."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.logs import PeerRepeats
from tests.support import RunningGateway, running_gateway, serving

BOUND = 10.0
"""Well inside the upstream's call timeout (30 s): what waited for it fails this bound."""

OnPost = Callable[[dict[str, Any], Send, Receive], Awaitable[Send | None]]
"""Offered each POSTed message (and the request's ``send`` and ``receive``): None to answer it
here (having sent the answer), else the ``send`` to pass FastMCP's answer through."""
Rewrite = Callable[[dict[str, Any]], bytes | None]
"""Offered each message on the stream: the data to send in its place, or None to keep it."""


def kit_server() -> FastMCP:
    server = FastMCP("kit")

    @server.tool
    def ping() -> str:
        """Answer at once."""
        return "pong"

    @server.tool
    def weather(city: str) -> str:
        """The weather in ``city``."""
        return f"sunny in {city}"

    @server.tool
    async def pings_back(ctx: Context) -> str:
        """Ping the client, and say so once answered."""
        await ctx.session.send_ping()
        return "answered"

    return server


async def passed(message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
    return send


def kept(message: dict[str, Any]) -> bytes | None:
    return None


def hostile(app: ASGIApp, on_post: OnPost, rewrite: Rewrite) -> ASGIApp:
    """``app`` (FastMCP's legacy SSE app), each POSTed message first offered to ``on_post``
    and each message on its stream to ``rewrite``."""

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["method"] == "GET":
            return await app(scope, receive, rewritten(send, rewrite))
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        answer = await on_post(json.loads(body), send, receive)
        if answer is None:
            return None
        unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return unread.pop() if unread else await receive()

        return await app(scope, replayed, answer)

    return upstream


def rewritten(send: Send, rewrite: Rewrite) -> Send:
    """``send`` for the SSE stream, each ``message`` event's data offered to ``rewrite``."""

    async def sending(message: Message) -> None:
        body: bytes = message.get("body", b"")
        if message["type"] == "http.response.body" and body.startswith(b"event: message"):
            data = body.split(b"data: ", 1)[1].strip()
            if (replaced := rewrite(json.loads(data))) is not None:
                message = {**message, "body": b"event: message\r\ndata: " + replaced + b"\r\n\r\n"}
        await send(message)

    return sending


def calls(message: dict[str, Any], tool: str) -> bool:
    return message.get("method") == "tools/call" and message["params"]["name"] == tool


def answers_with(message: dict[str, Any], text: str) -> bool:
    content = message.get("result", {}).get("content", [{}])
    return bool(content) and content[0].get("text") == text


@asynccontextmanager
async def sse_gateway(
    on_post: OnPost = passed, rewrite: Rewrite = kept, call_timeout: float = 30
) -> AsyncIterator[RunningGateway]:
    app = hostile(kit_server().http_app(transport="sse", path="/sse"), on_post, rewrite)
    async with serving(app) as base:
        upstream = {"url": f"{base}/sse", "transport": "sse", "protocol": "legacy", "timeout": call_timeout}
        upstream |= {"retry": {"initial_delay": 0.05, "max_delay": 0.1}}
        async with running_gateway({"upstreams": {"kit": upstream}}) as gw:
            yield gw


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.02)


# -- a POST that fails -------------------------------------------------------------------------


def failing_post(status: int, headers: list[tuple[bytes, bytes]]) -> OnPost:
    """Answers the POST of a ``weather`` call with ``status`` and a two-byte body (a
    ``content-length`` header past it cuts the answer short); passes the rest."""

    async def on_post(message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
        if not calls(message, "weather"):
            return send
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"no"})
        return None

    return on_post


class Written(logging.Handler):
    """The lines of the SDK's SSE client, written as the CLI's handler writes them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.addFilter(PeerRepeats())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


FAILED_POSTS = {
    "500": (500, [], "answered a POST with HTTP 500", "HTTPStatusError"),
    "429": (429, [], "answered a POST with HTTP 429", "HTTPStatusError"),
    "404": (404, [], "answered a POST with HTTP 404", "HTTPStatusError"),
    "elsewhere": (
        302,
        [(b"location", b"http://elsewhere.invalid/")],
        "answered a POST with HTTP 302",
        "HTTPStatusError",
    ),
    "cut-short": (
        202,
        [(b"content-length", b"100")],
        "a POST to its message endpoint failed (RemoteProtocolError",
        "RemoteProtocolError",
    ),
}


@pytest.mark.parametrize("kind", list(FAILED_POSTS))
async def test_a_post_that_fails_fails_its_call_at_once_and_the_upstream_reconnects(kind: str) -> None:
    # The SDK's writer stops at its first failed POST, its stream reading on: the call waited
    # its whole timeout, every later one failed as "Connection closed", the upstream "up".
    status, headers, reason, error = FAILED_POSTS[kind]
    written = Written()
    sdk = logging.getLogger("mcp.client.sse")
    sdk.addHandler(written)
    try:
        async with sse_gateway(failing_post(status, headers)) as gw, Client(gw.url) as client:
            upstream = gw.gateway.pool.get("kit")
            with anyio.fail_after(BOUND):
                failed = await client.call_tool("kit__weather", {"city": "Oslo"})
            await wait_until(lambda: upstream.connections == 2 and str(upstream.state) == "up")
            after = await client.call_tool("kit__ping", {})
    finally:
        sdk.removeHandler(written)
    assert failed.is_error
    assert reason in text_of(failed), text_of(failed)
    assert text_of(after) == "pong"
    [line] = [line for line in written.lines if "post_writer" in line]
    assert error in line
    assert "Traceback" not in line


async def stalled(message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
    """Never answers the POST of a ``weather`` call (until the client hangs up)."""
    if not calls(message, "weather"):
        return send
    while (await receive())["type"] != "http.disconnect":
        pass
    return None


async def test_a_post_never_answered_fails_its_call_within_its_timeout_and_the_upstream_reconnects() -> None:
    # The SDK's writer, which POSTs one message at a time, waited on it for its client's read
    # timeout (300 s): the call, and each later one (waiting behind it), failed after its
    # timeout and 5 s more (the SDK's wait to send its cancel), the upstream reported up.
    timeout = 2.0
    lines = Written()
    logging.getLogger().addHandler(lines)
    try:
        async with sse_gateway(stalled, call_timeout=timeout) as gw, Client(gw.url) as client:
            upstream = gw.gateway.pool.get("kit")
            began = anyio.current_time()
            failed = await client.call_tool("kit__weather", {"city": "Oslo"})
            took = anyio.current_time() - began
            await wait_until(lambda: upstream.connections == 2 and str(upstream.state) == "up")
            after = await client.call_tool("kit__ping", {})
    finally:
        logging.getLogger().removeHandler(lines)
    assert failed.is_error
    assert took < timeout + 2.5, took  # its own timeout, and the time to fail it
    assert text_of(after) == "pong"
    assert any("had no answer within its call's time" in line for line in lines.lines), lines.lines


async def answers_stalled(message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
    """Never answers the POST of the client's answer to a request of the upstream's."""
    if "method" in message:
        return send
    while (await receive())["type"] != "http.disconnect":
        pass
    return None


async def test_a_post_with_no_call_deadline_never_answered_is_bounded_and_the_upstream_reconnects() -> None:
    # The gateway's answer to the upstream's ping is sent from the SDK's reader, under no
    # call's deadline: its POST, never answered, held the writer for the SDK's read timeout
    # (300 s), every later call waiting behind it and failing, the upstream reported up.
    async with sse_gateway(answers_stalled, call_timeout=2.0) as gw, Client(gw.url) as client:
        upstream = gw.gateway.pool.get("kit")
        failed = await client.call_tool("kit__pings_back", {})
        await wait_until(lambda: upstream.connections == 2 and str(upstream.state) == "up")
        after = await client.call_tool("kit__ping", {})
    assert failed.is_error
    assert text_of(after) == "pong"


# -- what the stream says ----------------------------------------------------------------------


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


UNREAD = {
    "nan": ('{"result": "x", "v": NaN}', "NaN, Infinity or a number past a double's range"),
    "out-of-range": ('{"result": "x", "v": 1e400}', "NaN, Infinity or a number past a double's range"),
    "deep": (f'{{"result": "x", "v": {deep(300)}}}', "nests deeper than the gateway reads"),
    "deeper": (f'{{"result": "x", "v": {deep(5000)}}}', "nests deeper than the gateway reads"),
    "many": (f'{{"result": "x", "v": [{",".join(["0"] * 1_000_001)}]}}', "JSON values"),
}


@pytest.mark.parametrize("kind", list(UNREAD))
async def test_an_answer_on_the_stream_the_gateway_does_not_read_fails_its_call_alone(kind: str) -> None:
    structured, reason = UNREAD[kind]

    def rewrite(message: dict[str, Any]) -> bytes | None:
        if not answers_with(message, "sunny in Oslo"):
            return None
        result = f'{{"content": [{{"type": "text", "text": "x"}}], "structuredContent": {structured}}}'
        return f'{{"jsonrpc": "2.0", "id": {json.dumps(message["id"])}, "result": {result}}}'.encode()

    async with sse_gateway(rewrite=rewrite) as gw, Client(gw.url) as client:
        with anyio.fail_after(BOUND):
            unread = await client.call_tool("kit__weather", {"city": "Oslo"})
        after = await client.call_tool("kit__ping", {})
        upstream = gw.gateway.pool.get("kit")
    assert unread.is_error
    assert reason in text_of(unread), text_of(unread)
    assert text_of(after) == "pong"
    assert upstream.connections == 1  # the session went on


# -- what a POST's answer holds ----------------------------------------------------------------


async def endless(message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
    """Answers the POST of each ``ping`` call FastMCP's 202, its body a mebibyte that then
    never ends (until the client hangs up): only a client that stops reading at its bound
    sends another message after it."""
    if not calls(message, "ping"):
        return send

    async def flood() -> None:
        await send({"type": "http.response.body", "body": b"x" * 2**20, "more_body": True})
        await anyio.sleep_forever()

    async def answering(answer: Message) -> None:
        if answer["type"] == "http.response.start":  # of no stated length
            headers = [(k, v) for k, v in answer.get("headers", []) if k.lower() != b"content-length"]
            return await send({**answer, "headers": headers})
        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            while (await receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

    return answering


async def test_a_posts_endless_answer_is_read_to_a_bound_and_the_next_post_goes_out() -> None:
    # The SDK read a POST's answer whole, and sends one POST at a time: a 202 with 400 MiB
    # took the gateway to 1 GB; an endless one stopped every later message.
    async with sse_gateway(endless) as gw, Client(gw.url) as client:
        with anyio.fail_after(BOUND):
            first = await client.call_tool("kit__ping", {})
            second = await client.call_tool("kit__weather", {"city": "Oslo"})
    assert text_of(first) == "pong"
    assert text_of(second) == "sunny in Oslo"


# -- cookies -----------------------------------------------------------------------------------


class Cookies:
    """Sets 50 new cookies of 1 KB on each POST's answer; records the cookies each POST sent."""

    def __init__(self) -> None:
        self.answers = 0
        self.sent: list[int] = []

    async def on_post(self, message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
        async def setting(answer: Message) -> None:
            if answer["type"] == "http.response.start":
                self.answers += 1
                fresh = [(b"set-cookie", b"c%d-%d=%s" % (self.answers, n, b"v" * 1000)) for n in range(50)]
                answer = {**answer, "headers": [*answer.get("headers", []), *fresh]}
            await send(answer)

        return setting

    def seen(self, scope: Scope) -> None:
        cookie = dict(scope["headers"]).get(b"cookie", b"")
        self.sent.append(len(cookie.split(b";")) if cookie else 0)


async def test_a_legacy_sse_upstreams_cookies_are_bounded_as_a_streamable_http_ones() -> None:
    cookies = Cookies()
    app = hostile(kit_server().http_app(transport="sse", path="/sse"), cookies.on_post, kept)

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            cookies.seen(scope)
        await app(scope, receive, send)

    async with serving(recording) as base:
        upstream = {"url": f"{base}/sse", "transport": "sse", "protocol": "legacy"}
        async with running_gateway({"upstreams": {"kit": upstream}}) as gw, Client(gw.url) as client:
            for _ in range(20):
                assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    assert len(cookies.sent) > 20
    assert max(cookies.sent) == 50  # RFC 6265's least, as for Streamable HTTP (1,250 before)


async def refuse_every_post(message: dict[str, Any], send: Send, receive: Receive) -> Send | None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"not here"})
    return None


async def test_an_upstream_refusing_every_post_is_down_naming_the_status() -> None:
    app = hostile(kit_server().http_app(transport="sse", path="/sse"), refuse_every_post, kept)
    async with serving(app) as base:
        upstream = {"url": f"{base}/sse", "transport": "sse", "protocol": "legacy", "connect_timeout": 30}
        async with running_gateway({"upstreams": {"kit": upstream}}) as gw:
            [status] = gw.gateway.pool.statuses()
    assert str(status.state) == "down"
    assert status.last_error is not None
    assert "HTTP 404" in status.last_error, status.last_error
