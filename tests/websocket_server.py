"""Test support: an inline FastMCP server served over MCP's WebSocket transport on loopback.

Neither mcp 2.x nor FastMCP serves WebSocket any more, so this bridges a Starlette
``WebSocketRoute`` to FastMCP's low-level server loop the way its stdio transport does
(``FastMCP.run_stdio_async``): the server lifespan around the app, ``_mcp_server.run`` on
memory streams per connection. The wire is mcp 1.x's: subprotocol ``mcp``, one JSON-RPC
message per text frame.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from fastmcp import FastMCP
from mcp.shared.message import SessionMessage
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.support import serving

SUBPROTOCOL = "mcp"
Handshake = Callable[[Mapping[str, str]], None]
"""Told the headers of each WebSocket handshake the server receives."""


@asynccontextmanager
async def serving_websocket_upstream(
    server: FastMCP, sock: socket.socket | None = None, on_handshake: Handshake | None = None
) -> AsyncIterator[str]:
    """Serve ``server`` over WebSocket on loopback (on ``sock`` if given); yield its ws:// URL."""
    async with serving(websocket_app(server, on_handshake), sock) as base:
        yield f"ws://{base.removeprefix('http://')}/ws"


def websocket_app(server: FastMCP, on_handshake: Handshake | None = None) -> Starlette:
    async def endpoint(websocket: WebSocket) -> None:
        if on_handshake is not None:
            on_handshake(dict(websocket.headers))
        if SUBPROTOCOL not in websocket.scope.get("subprotocols", []):
            await websocket.close(code=1002)  # before accept: the handshake is refused (403)
            return
        await websocket.accept(subprotocol=SUBPROTOCOL)
        await serve_connection(server, websocket)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with server._lifespan_manager():  # pyright: ignore[reportPrivateUsage]
            yield

    return Starlette(routes=[WebSocketRoute("/ws", endpoint)], lifespan=lifespan)


async def serve_connection(server: FastMCP, websocket: WebSocket) -> None:
    """Run the server's loop for one accepted connection, until the client goes."""
    lowlevel = server._mcp_server  # pyright: ignore[reportPrivateUsage]
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    async with read_writer, read_stream, write_stream, write_reader, anyio.create_task_group() as tg:
        tg.start_soon(_frames_in, websocket, read_writer)
        tg.start_soon(_frames_out, websocket, write_reader)
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
        tg.cancel_scope.cancel()


async def _frames_in(websocket: WebSocket, sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    async with sink:
        try:
            while True:
                text = await websocket.receive_text()
                try:
                    message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
                except ValueError as exc:
                    await sink.send(exc)
                    continue
                await sink.send(SessionMessage(message))
        except (WebSocketDisconnect, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the client went (its end of the loop then ends too)


async def _frames_out(websocket: WebSocket, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
    async with source:
        try:
            async for session_message in source:
                await websocket.send_text(
                    session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                )
        except WebSocketDisconnect:
            pass
