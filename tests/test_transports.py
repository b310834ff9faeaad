"""Legacy SSE and WebSocket upstreams, each served by a real server of its kind.

SSE is FastMCP's own legacy SSE app; WebSocket is FastMCP's server bridged to a Starlette
WebSocket route (tests/websocket_server.py), since no current SDK serves it. The first tests
drive the gateway's WebSocket client directly; the rest go through a running gateway with
the official client downstream.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from anyio.abc import TaskStatus
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp import Client
from mcp.shared.message import SessionMessage
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from agent_gateway.upstreams.websocket import websocket_client
from tests.support import free_port, free_socket, running_gateway, serving, serving_upstream
from tests.websocket_server import serving_websocket_upstream

PROTOCOLS = ["legacy", "auto"]
"""The upstream's era: the initialize handshake (what 1.x-era SSE and WebSocket servers
speak), or the gateway's first choice, the modern era (which FastMCP serves on both)."""
BOUND = 10.0
BIG = "x" * (2 * 2**20)
"""Twice the websockets library's default frame limit."""


def kit_server() -> FastMCP:
    server = FastMCP("kit")

    @server.tool
    def ping() -> str:
        """Answer at once."""
        return "pong"

    @server.tool
    def weather(city: str) -> dict[str, Any]:
        """Structured weather."""
        return {"city": city, "celsius": 21.5}

    @server.tool
    def broken() -> str:
        """Always fails."""
        raise ToolError("kit exploded")

    @server.tool
    async def steps(count: int, ctx: Context) -> int:
        """Report ``count`` progress steps, in order, then return ``count``."""
        for step in range(1, count + 1):
            await ctx.report_progress(step, count, f"step {step}")
        return count

    @server.tool
    def big(size: int) -> str:
        """A result of ``size`` bytes."""
        return "x" * size

    @server.resource("kit://readme", mime_type="text/plain")
    def readme() -> str:
        return "kit readme"

    return server


@asynccontextmanager
async def serving_sse_upstream(server: FastMCP) -> AsyncIterator[str]:
    """Serve ``server`` with FastMCP's legacy SSE app; yield its ``/sse`` URL."""
    async with serving(server.http_app(transport="sse", path="/sse")) as base:
        yield f"{base}/sse"


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def wait_until(predicate: Callable[[], bool], bound: float) -> None:
    with anyio.fail_after(bound):
        while not predicate():
            await anyio.sleep(0.02)


# -- the WebSocket client on its own ------------------------------------------------------


async def echo_once(websocket: WebSocket) -> None:
    """Accept ``mcp``, send a frame that is not JSON, echo one frame, then close."""
    await websocket.accept(subprotocol="mcp")
    await websocket.send_text("this is not json")
    await websocket.send_text(await websocket.receive_text())
    await websocket.close()


async def test_the_websocket_client_frames_messages_surfaces_bad_ones_and_ends_on_close() -> None:
    note = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"data": BIG})
    async with serving(Starlette(routes=[WebSocketRoute("/ws", echo_once)])) as base:
        url = f"ws://{base.removeprefix('http://')}/ws"
        with anyio.fail_after(BOUND):
            async with websocket_client(url, {}) as (read_stream, write_stream):
                bad = await read_stream.receive()
                await write_stream.send(SessionMessage(note))
                echoed = await read_stream.receive()
                with pytest.raises(anyio.EndOfStream):
                    await read_stream.receive()
    assert isinstance(bad, ValueError)
    assert isinstance(echoed, SessionMessage)
    assert echoed.message == note  # 2 MiB: past the library's default limit


async def test_leaving_the_websocket_client_closes_the_connection_even_when_cancelled() -> None:
    gone = anyio.Event()

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept(subprotocol="mcp")
        try:
            await websocket.receive_text()
        except WebSocketDisconnect:
            gone.set()

    async with serving(Starlette(routes=[WebSocketRoute("/ws", endpoint)])) as base:
        url = f"ws://{base.removeprefix('http://')}/ws"
        with anyio.CancelScope() as scope:
            async with websocket_client(url, {}) as (read_stream, _):
                scope.cancel()
                await read_stream.receive()  # cancelled here: nothing ever arrives
        assert scope.cancelled_caught
        with anyio.fail_after(BOUND):
            await gone.wait()


# -- through the gateway ------------------------------------------------------------------

UpstreamFactory = Callable[[FastMCP], AbstractAsyncContextManager[str]]
KINDS: dict[str, tuple[UpstreamFactory, dict[str, str]]] = {
    "sse": (serving_sse_upstream, {"transport": "sse"}),
    "websocket": (serving_websocket_upstream, {"transport": "websocket"}),
    "websocket-by-url": (serving_websocket_upstream, {}),
}


@asynccontextmanager
async def kit_gateway(kind: str, protocol: str) -> AsyncIterator[tuple[str, str]]:
    """A gateway over the kit upstream served as ``kind``; yields (gateway URL, transport)."""
    serve, extra = KINDS[kind]
    async with serve(kit_server()) as upstream:
        config = {"upstreams": {"kit": {"url": upstream, "protocol": protocol, **extra}}}
        async with running_gateway(config) as gw:
            [status] = gw.gateway.pool.statuses()
            assert str(status.state) == "up", status
            yield gw.url, status.transport


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("kind", list(KINDS))
async def test_an_upstream_is_aggregated_over_its_transport(kind: str, protocol: str) -> None:
    async with kit_gateway(kind, protocol) as (url, transport), Client(url) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        pong = await client.call_tool("kit__ping", {})
        weather = await client.call_tool("kit__weather", {"city": "Oslo"})
        broken = await client.call_tool("kit__broken", {})
        readme = await client.read_resource("kit://readme")
    assert transport == kind.removesuffix("-by-url")
    assert {"kit__ping", "kit__weather", "kit__broken", "kit__steps"} <= names
    assert text_of(pong) == "pong"
    assert weather.structured_content == {"city": "Oslo", "celsius": 21.5}
    assert broken.is_error
    assert "kit exploded" in text_of(broken)
    [content] = readme.contents
    assert isinstance(content, types.TextResourceContents)
    assert content.text == "kit readme"


async def test_an_upstream_pinned_to_the_modern_era_lists_what_its_discover_says_it_has() -> None:
    """Pinned, the SDK sends nothing at connect and makes up a discover result with no
    capabilities: the gateway asks the server's own, so its tools, prompts and resources are listed."""
    async with serving(kit_server().http_app(path="/mcp")) as base:
        config = {"upstreams": {"kit": {"url": f"{base}/mcp", "protocol": "2026-07-28"}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            pong = await client.call_tool("kit__ping", {})
            readme = await client.read_resource("kit://readme")
    assert {"kit__ping", "kit__weather", "kit__broken", "kit__steps"} <= names
    assert text_of(pong) == "pong"
    [content] = readme.contents
    assert isinstance(content, types.TextResourceContents)
    assert content.text == "kit readme"


async def posted(receive: Receive) -> tuple[bytes, dict[str, Any]]:
    """A POST's whole body, and the JSON-RPC request in it ({} if it holds none)."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    return body, json.loads(body) if body.startswith(b"{") else {}


def without_discover(app: ASGIApp) -> ASGIApp:
    """``app``, except that ``server/discover`` is answered as a method it does not know."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body, request = await posted(receive)
        if request.get("method") != "server/discover":
            await app(scope, replay(body, receive), send)
            return
        error = {"code": types.METHOD_NOT_FOUND, "message": "Method not found"}
        answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return guarded


async def test_an_upstream_pinned_to_the_modern_era_without_discover_still_connects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As before the gateway asked: up, listing nothing it did not say it has, and saying why."""
    async with serving(without_discover(kit_server().http_app(path="/mcp"))) as base:
        config = {"upstreams": {"kit": {"url": f"{base}/mcp", "protocol": "2026-07-28"}}}
        async with running_gateway(config) as gw:
            [status] = gw.gateway.pool.statuses()
    assert str(status.state) == "up", status
    assert "answers no server/discover" in caplog.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("kind", ["sse", "websocket"])
async def test_progress_from_the_upstream_reaches_the_client_in_order(kind: str, protocol: str) -> None:
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async with kit_gateway(kind, protocol) as (url, _), Client(url) as client:
        result = await client.call_tool("kit__steps", {"count": 5}, progress_callback=on_progress)
        await wait_until(lambda: len(received) >= 5, BOUND)
    assert not result.is_error
    assert received == [(float(n), 5.0, f"step {n}") for n in range(1, 6)]


async def test_a_websocket_upstream_receives_its_configured_headers() -> None:
    handshakes: list[Mapping[str, str]] = []
    async with serving_websocket_upstream(kit_server(), on_handshake=handshakes.append) as url:
        upstream = {"url": url, "headers": {"Authorization": "Bearer ${KIT_TOKEN}", "X-Tenant": "acme"}}
        async with (
            running_gateway({"upstreams": {"kit": upstream}}, environ={"KIT_TOKEN": "s3cret"}) as gw,
            Client(gw.url) as client,
        ):
            assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    assert handshakes, "the upstream saw no handshake"
    for headers in handshakes:
        assert headers["authorization"] == "Bearer s3cret"
        assert headers["x-tenant"] == "acme"
        assert headers["sec-websocket-protocol"] == "mcp"


async def test_a_websocket_upstream_is_not_offered_compression_so_it_cannot_send_a_deflate_bomb() -> None:
    # Inflating runs on the event loop: 100 KB deflated was a 100 MB message and 0.3 s of the
    # loop for every client. This server (uvicorn) accepts permessage-deflate when offered.
    handshakes: list[Mapping[str, str]] = []
    async with (
        serving_websocket_upstream(kit_server(), on_handshake=handshakes.append) as url,
        running_gateway({"upstreams": {"kit": {"url": url}}}) as gw,
        Client(gw.url) as client,
    ):
        assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    assert handshakes, "the upstream saw no handshake"
    assert [headers.get("sec-websocket-extensions") for headers in handshakes] == [None] * len(handshakes)


async def test_a_websocket_upstream_that_never_answers_the_handshake_is_down_after_connect_timeout() -> None:
    with free_socket() as silent:
        silent.listen()  # the kernel completes TCP connections; nobody ever answers the upgrade
        url = f"ws://127.0.0.1:{silent.getsockname()[1]}/ws"
        started = time.monotonic()
        async with running_gateway({"upstreams": {"mute": {"url": url, "connect_timeout": 0.5}}}) as gw:
            [status] = gw.gateway.pool.statuses()
            elapsed = time.monotonic() - started
    assert str(status.state) == "down"
    assert status.last_error is not None
    assert "connect_timeout (0.5s)" in status.last_error
    assert elapsed < 5


def socket_on(port: int) -> socket.socket:
    """A loopback socket bound to ``port`` again (SO_REUSEADDR, as ``free_socket`` sets)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


async def test_a_websocket_upstream_that_goes_away_fails_calls_naming_it_and_is_back_when_it_is() -> None:
    port = free_port()  # served again on it later: not one another worker may take meanwhile
    sock = socket_on(port)
    stop, stopped = anyio.Event(), anyio.Event()

    async def first_life(*, task_status: TaskStatus[str]) -> None:
        async with serving_websocket_upstream(kit_server(), sock) as url:
            task_status.started(url)
            await stop.wait()
        stopped.set()

    async with anyio.create_task_group() as tg:
        url = await tg.start(first_life)
        config = {"upstreams": {"kit": {"url": url, "timeout": 30}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            assert text_of(await client.call_tool("kit__ping", {})) == "pong"
            stop.set()
            with anyio.fail_after(BOUND):
                await stopped.wait()
            started = time.monotonic()
            gone = await client.call_tool("kit__ping", {})
            assert time.monotonic() - started < 5  # well inside the 30 s timeout
            assert gone.is_error
            assert "upstream 'kit'" in text_of(gone)
            upstream = gw.gateway.pool.get("kit")
            await wait_until(lambda: upstream.state != "up", BOUND)
            async with serving_websocket_upstream(kit_server(), socket_on(port)) as again:
                assert again == url
                await wait_until(lambda: upstream.state == "up", 20)
                assert text_of(await client.call_tool("kit__ping", {})) == "pong"


async def test_a_legacy_sse_result_over_a_mebibyte_arrives_and_a_call_beside_it_is_answered() -> None:
    # The SDK's SSE client bounds each event at 1 MiB, and took no bound to pass: a 2 MiB
    # result ended the stream, that call and every other in flight on it failing as
    # "connection closed", and the upstream reconnected. The bound is max_message_bytes.
    results: dict[str, types.CallToolResult] = {}
    async with kit_gateway("sse", "legacy") as (url, _), Client(url) as client, Client(url) as beside:

        async def call(on: Client, name: str, arguments: dict[str, Any]) -> None:
            results[name] = await on.call_tool(f"kit__{name}", arguments)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, beside, "steps", {"count": 3})
            tg.start_soon(call, client, "big", {"size": len(BIG)})
        after = await client.call_tool("kit__ping", {})
    assert not results["big"].is_error, text_of(results["big"])
    assert text_of(results["big"]) == BIG
    assert text_of(results["steps"]) == "3"
    assert text_of(after) == "pong"


# -- Streamable HTTP: the size of one message -----------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_streamable_http_result_over_a_mebibyte_arrives_in_either_era(protocol: str) -> None:
    # A handshake-era upstream answers on an SSE stream, where the SDK's own bound is 1 MiB
    # per event; the gateway's is max_message_bytes (128 MiB by default).
    async with serving_upstream(kit_server()) as upstream:
        config = {"upstreams": {"kit": {"url": upstream, "protocol": protocol}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            result = await client.call_tool("kit__big", {"size": len(BIG)})
            [status] = gw.gateway.pool.statuses()
    assert not result.is_error
    assert text_of(result) == BIG
    assert str(status.state) == "up"


async def test_a_streamable_http_answer_over_max_message_bytes_fails_that_call_alone() -> None:
    async with serving_upstream(kit_server()) as upstream:
        config = {"upstreams": {"kit": {"url": upstream, "max_message_bytes": 2**20}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            oversized = await client.call_tool("kit__big", {"size": len(BIG)})
            after = await client.call_tool("kit__ping", {})
            [status] = gw.gateway.pool.statuses()
    assert oversized.is_error
    assert f"over max_message_bytes ({2**20} bytes)" in text_of(oversized)
    assert text_of(after) == "pong"
    assert str(status.state) == "up"
    assert status.as_dict()["connections"] == 1  # not reconnected: the call failed, not the link


ENDLESS = 123456789
"""The ``size`` for which ``endless_answers`` answers ``kit__big`` with a body that never ends."""


def endless_answers(app: ASGIApp) -> ASGIApp:
    """``app``, except that a call of ``big`` with ``size`` ENDLESS is answered with a JSON
    body that passes a mebibyte and then stalls until the client hangs up: only a gateway
    that refuses as soon as the limit is passed can answer that call."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body, request = await posted(receive)
        if request.get("params", {}).get("arguments", {}).get("size") != ENDLESS:
            await app(scope, replay(body, receive), send)
            return
        head = b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "'
        start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
        await send(start)
        await send(
            {
                "type": "http.response.body",
                "body": head % json.dumps(request["id"]).encode(),
                "more_body": True,
            }
        )
        for _ in range(20):
            await send({"type": "http.response.body", "body": b"x" * 2**16, "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass

    return guarded


def replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_streamable_http_answer_that_never_ends_fails_once_it_passes_max_message_bytes(
    protocol: str,
) -> None:
    app = endless_answers(kit_server().http_app(path="/mcp"))
    async with serving(app) as base:
        upstream = {"url": f"{base}/mcp", "max_message_bytes": 2**20, "protocol": protocol, "timeout": 60}
        async with running_gateway({"upstreams": {"kit": upstream}}) as gw, Client(gw.url) as client:
            with anyio.fail_after(BOUND):
                endless = await client.call_tool("kit__big", {"size": ENDLESS})
            assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    assert endless.is_error
    assert f"over max_message_bytes ({2**20} bytes)" in text_of(endless)
