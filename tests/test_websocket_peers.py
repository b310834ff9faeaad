"""WebSocket upstreams that misbehave on purpose: raw ``websockets`` servers that speak MCP
well enough to be listed, then flood the gateway with pings, stop reading their pongs, or
send a text frame that is not UTF-8.

Each is a real server on loopback; the gateway's side is the real client (``websocket.py``),
driven directly or through a running gateway with a bystander upstream beside it.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.message import SessionMessage
from websockets.asyncio.server import ServerConnection, serve
from websockets.protocol import State
from websockets.typing import Subprotocol

from agent_gateway.upstreams.pings import PingBounds
from agent_gateway.upstreams.websocket import websocket_client
from tests.support import free_socket, running_gateway, serving_upstream

BOUND = 20.0
Behaviour = Callable[[ServerConnection], Awaitable[None]]
EMPTY_PINGS = b"\x89\x00" * (128 * 2**10)
"""256 KiB of empty ping frames, as a server writes them (unmasked)."""
FULL_PING = b"\x89\x7d" + b"p" * 125
"""A ping with the largest payload a control frame holds."""


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """What a plain MCP server answers: its handshake, one tool, and ``{}`` to the rest."""
    result: dict[str, Any] = {}
    if request["method"] == "initialize":
        result = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif request["method"] == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


async def served_until(ws: ServerConnection, method: str) -> dict[str, Any]:
    """Answer the gateway's requests until one for ``method``, returned unanswered."""
    async for text in ws:
        message = json.loads(text)
        if "id" not in message or "method" not in message:
            continue  # a notification
        if message["method"] == method:
            return message
        await ws.send(json.dumps(answer(message)))
    raise AssertionError(f"the gateway closed the connection before asking {method}")


@asynccontextmanager
async def raw_upstream(behaviour: Behaviour, receive_buffer: int | None = None) -> AsyncIterator[str]:
    """A ``websockets`` server on loopback running ``behaviour`` for each connection; its URL.
    ``receive_buffer``: its sockets' kernel buffer (else the kernel's, up to 32 MiB here)."""
    sock = free_socket()
    if receive_buffer is not None:  # set before listening: accepted sockets inherit it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    async with serve(behaviour, sock=sock, subprotocols=[Subprotocol("mcp")]):
        yield f"ws://127.0.0.1:{sock.getsockname()[1]}/ws"


async def until_written(ws: ServerConnection) -> None:
    """Wait until what the server wrote has reached its socket, or the connection is going."""
    while ws.transport.get_write_buffer_size() > 0 and ws.state is State.OPEN:
        await anyio.sleep(0.01)


def legacy(url: str) -> dict[str, Any]:
    return {"url": url, "protocol": "legacy"}


def bystander() -> FastMCP:
    server = FastMCP("kit")

    @server.tool
    def ping() -> str:
        """Answer at once."""
        return "pong"

    return server


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


# -- pings --------------------------------------------------------------------------------


async def test_a_ping_flood_closes_the_upstreams_connection_and_a_bystander_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One 256 KiB read holds ~131,000 empty pings, each answered on the event loop: 600,000 of
    # them held a bystander's call for 4 s. Past the bound the gateway stops answering and
    # closes (1008), and the rest of what it read is not parsed.
    go = anyio.Event()
    codes: list[int | None] = []

    async def flooding(ws: ServerConnection) -> None:
        await ws.send(json.dumps(answer(await served_until(ws, "tools/list"))))
        if codes:
            await ws.wait_closed()  # a reconnection: served quietly
            return
        await go.wait()
        while ws.state is State.OPEN:  # never reading: the library reads the close for it
            ws.transport.write(EMPTY_PINGS)
            await until_written(ws)
        await ws.wait_closed()
        codes.append(ws.close_code)

    async with (
        raw_upstream(flooding) as url,
        serving_upstream(bystander()) as kit,
        running_gateway({"upstreams": {"raw": legacy(url), "kit": {"url": kit}}}) as gw,
        Client(gw.url) as client,
    ):
        go.set()
        with anyio.fail_after(BOUND):
            assert text_of(await client.call_tool("kit__ping", {})) == "pong"
            while not codes:
                await anyio.sleep(0.02)
    assert codes == [1008]
    closed = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.upstreams.websocket"]
    assert any("over 100 pings a second" in line for line in closed), closed


async def test_pongs_an_upstream_does_not_read_end_its_connection_past_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Pings within any rate, their pongs never read: they filled the kernel's buffers, then
    # the gateway's (2M pings: 404 MB). Past the bound the close frame cannot be read either,
    # so the connection is dropped after the close timeout, and the read stream ends.
    async def not_reading(ws: ServerConnection) -> None:
        ws.transport.pause_reading()
        sent = 0
        while ws.state is State.OPEN and sent < 16 * 2**20:  # four times what fills the buffers
            ws.transport.write(FULL_PING * 8192)
            sent += len(FULL_PING) * 8192
            await until_written(ws)
        ws.transport.resume_reading()  # to see the connection dropped
        await ws.wait_closed()

    any_rate = PingBounds(per_second=1e9, unwritten=64 * 2**10)
    async with raw_upstream(not_reading, receive_buffer=2**16) as url:
        with anyio.fail_after(BOUND):
            async with websocket_client(url, {}, pings=any_rate) as (read_stream, _):
                with pytest.raises(anyio.EndOfStream):
                    await read_stream.receive()
    closed = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.upstreams.websocket"]
    assert any("over 65536 bytes of pongs unread" in line for line in closed), closed


# -- frames the gateway does not read -------------------------------------------------------


def fragmented(message: bytes) -> bytes:
    """``message`` as a text frame of its first byte and a continuation frame per byte after."""
    *rest, last = message[1:]
    return b"\x01\x01" + message[:1] + b"".join(bytes([0, 1, byte]) for byte in rest) + bytes([0x80, 1, last])


FLOODS = {
    "100,000 fragments of a byte": fragmented(
        b'{"jsonrpc": "2.0", "method": "x", "params": {"p": "%s"}}' % (b"p" * 100_000)
    ),
    "300,000 empty messages": b"\x81\x00" * 300_000,
}


@pytest.mark.parametrize("flood", FLOODS, ids=list(FLOODS))
async def test_a_read_of_frames_no_message_is_as_small_as_closes_the_connection_unparsed(flood: str) -> None:
    # Each frame of a read was parsed in one callback, the library's bound on fragments (4,096)
    # checked only once they were queued: 87,000 to 131,000 frames a 256 KiB read, 0.4 to 1.5 s
    # of the event loop for every client each; empty messages went on for as long as sent.
    flooded = anyio.Event()

    async def flooding(ws: ServerConnection) -> None:
        if flooded.is_set():
            await ws.wait_closed()  # a reconnection: served quietly
            return
        call = await served_until(ws, "tools/call")
        flooded.set()
        ws.transport.write(FLOODS[flood])
        await ws.send(json.dumps(answer(call)))
        await ws.wait_closed()

    upstreams: dict[str, Any] = {}
    async with raw_upstream(flooding) as url, serving_upstream(bystander()) as kit:
        upstreams["raw"], upstreams["kit"] = {**legacy(url), "timeout": 60}, {"url": kit}
        async with running_gateway({"upstreams": upstreams}) as gw, Client(gw.url) as client:
            with anyio.fail_after(BOUND):  # empty messages: the call waited its whole timeout
                result = await client.call_tool("raw__echo", {})
                assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    assert result.is_error
    # Empty messages make no message either: past 1,024 of them the connection is let go too,
    # whichever bound a read's size reaches first (``upstreams/noise.py``).
    reasons = [FRAMES_CLOSE, "made no message"] if flood == "300,000 empty messages" else [FRAMES_CLOSE]
    assert any(reason in text_of(result) for reason in reasons), text_of(result)


FRAMES_CLOSE = "the gateway closed its websocket: 1008 (policy violation) over 8192 frames in one read"


NOT_JSON = b"\x81\x1e" + b"x" * 30
"""A text frame of 32 bytes that is no JSON: as many in a read as the smallest message."""


async def test_messages_that_are_not_json_rpc_without_end_fail_the_call_and_a_bystander_is_served() -> None:
    # Each was parsed, reported and dropped, under the bound of frames a read (as small as the
    # smallest message): 71 % of a core until the call's timeout (60 s here), the upstream up.
    flooded, closed = anyio.Event(), anyio.Event()

    async def flooding(ws: ServerConnection) -> None:
        if flooded.is_set():
            await ws.wait_closed()  # a reconnection: served quietly
            return
        await served_until(ws, "tools/call")
        flooded.set()
        while ws.state is State.OPEN:
            ws.transport.write(NOT_JSON * 8192)
            await until_written(ws)
        closed.set()

    upstreams: dict[str, Any] = {}
    async with raw_upstream(flooding) as url, serving_upstream(bystander()) as kit:
        upstreams["raw"], upstreams["kit"] = {**legacy(url), "timeout": 60}, {"url": kit}
        async with running_gateway({"upstreams": upstreams}) as gw, Client(gw.url) as client:
            with anyio.fail_after(BOUND):
                result = await client.call_tool("raw__echo", {})
                assert text_of(await client.call_tool("kit__ping", {})) == "pong"
                await closed.wait()  # the flooded connection let go
    assert result.is_error
    assert "made no message" in text_of(result), text_of(result)


async def test_a_text_frame_that_is_not_utf8_fails_the_call_it_answers_at_once() -> None:
    async def garbling(ws: ServerConnection) -> None:
        call = await served_until(ws, "tools/call")
        text = json.dumps(answer(call)).encode()
        await ws.send(text.replace(b'"result": {}', b'"result": {"x": "\xff"}'), text=True)
        await ws.wait_closed()

    async with (
        raw_upstream(garbling) as url,
        running_gateway({"upstreams": {"raw": {**legacy(url), "timeout": 60}}}) as gw,
        Client(gw.url) as client,
    ):
        with anyio.fail_after(BOUND):  # well inside the call's own 60 s
            result = await client.call_tool("raw__echo", {})
    assert result.is_error
    assert "UTF-8" in text_of(result)


async def test_a_websocket_message_the_gateway_refuses_is_logged_under_the_websocket_transport(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def sending_nan(ws: ServerConnection) -> None:
        await ws.send('{"jsonrpc": "2.0", "id": 1, "result": {"x": NaN}}')
        await ws.wait_closed()

    caplog.set_level(logging.WARNING)
    async with raw_upstream(sending_nan) as url:
        with anyio.fail_after(BOUND):
            async with websocket_client(url, {}, label="raw") as (read_stream, _):
                refused = await read_stream.receive()
    assert isinstance(refused, SessionMessage)
    assert isinstance(refused.message, types.JSONRPCError)  # its call fails at once
    names = {r.name for r in caplog.records if "NaN" in r.getMessage()}
    assert names == {"agent_gateway.upstreams.websocket"}


# -- the connection's end -------------------------------------------------------------------


async def test_a_close_during_a_call_fails_it_with_the_close_code_and_reason() -> None:
    # The close's code and reason reached only the log: the caller read "connection closed".
    closed = anyio.Event()

    async def closing(ws: ServerConnection) -> None:
        if closed.is_set():
            await ws.wait_closed()  # a reconnection: served quietly
            return
        await served_until(ws, "tools/call")
        await ws.close(1011, "overloaded!")
        closed.set()

    async with (
        raw_upstream(closing) as url,
        running_gateway({"upstreams": {"raw": legacy(url)}}) as gw,
        Client(gw.url) as client,
    ):
        with anyio.fail_after(BOUND):
            result = await client.call_tool("raw__echo", {})
    assert result.is_error
    assert "the upstream closed its websocket: 1011 (internal error) overloaded!" in text_of(result)


UNFINISHED_CLOSES = {
    # A close frame with a code no endpoint may send (1005 means "none was sent").
    "code 1005 on the wire": (b"\x88\x02\x03\xed", "the gateway closed its websocket: 1002"),
    "a clean close": (b"\x88\x05\x03\xe8bye", "the upstream closed its websocket: 1000 (OK) bye"),
    "a frame of 2**62 bytes": (b"\x82\x7f" + (2**62).to_bytes(8, "big"), "1009 (message too big)"),
}


@pytest.mark.parametrize("sent", UNFINISHED_CLOSES, ids=list(UNFINISHED_CLOSES))
async def test_a_close_the_upstream_never_finishes_fails_the_call_once_the_close_timeout_passes(
    sent: str,
) -> None:
    # The upstream sends a close, or something the gateway closes for, then keeps its socket
    # open and reads nothing more (the gateway's close unread). The library only noted the
    # close's deadline: the call waited for its keepalive ping, 19 s later.
    wire, said = UNFINISHED_CLOSES[sent]
    done = anyio.Event()

    async def closing_unfinished(ws: ServerConnection) -> None:
        if done.is_set():
            await ws.wait_closed()  # a reconnection: served quietly
            return
        await served_until(ws, "tools/call")
        ws.transport.pause_reading()  # the gateway's close frame is never read
        ws.transport.write(wire)
        await done.wait()
        ws.transport.resume_reading()
        await ws.wait_closed()

    upstreams = {"raw": {**legacy(""), "timeout": 60}}
    async with raw_upstream(closing_unfinished) as url, serving_upstream(bystander()) as kit:
        upstreams["raw"]["url"], upstreams["kit"] = url, {"url": kit}
        async with running_gateway({"upstreams": upstreams}) as gw, Client(gw.url) as client:
            try:
                with anyio.fail_after(10):  # the keepalive ping came after 20 s
                    result = await client.call_tool("raw__echo", {})
            finally:
                done.set()
            assert text_of(await client.call_tool("kit__ping", {})) == "pong"
    assert result.is_error
    assert said in text_of(result)
