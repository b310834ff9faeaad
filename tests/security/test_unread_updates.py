"""A handshake-era client subscribed to a resource that changes often, and that never reads its
notification stream, against a bystander subscribed to another resource of the same upstream.
An upstream session's updates were relayed by one task, to each subscriber in turn, each send
allowed 5 s: once the attacker's stream was full, every update of that upstream waited 5 s for
it, the updates behind were dropped, and the bystander's never came (60 s; 0.02 s alone). Now
each session's updates wait in a queue of its own, sent by a task of its own, and only so many
are kept for a session that far behind."""

from __future__ import annotations

import os
import signal
import socket
import warnings
from typing import Any

import anyio
import httpx
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.servers import recorder
from tests.support import python_upstream, running_gateway, serving_upstream

BOUND = 30.0
VERSION = "2025-11-25"
LONG = "note://" + "x" * 8000
"""The attacker's resource: long, so that its updates fill its stream in a few hundred."""
FLOOD = 4000
"""The attacker's updates while it reads none."""
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _subscribed_session(url: str) -> str:
    """A handshake-era session subscribed to ``LONG``; its id."""
    async with httpx.AsyncClient() as http:
        info = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "a", "version": "0"}}
        opened = await http.post(
            url, headers=HEADERS, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": info}
        )
        session = opened.headers["mcp-session-id"]
        headers = HEADERS | {"Mcp-Session-Id": session, "MCP-Protocol-Version": VERSION}
        await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        body = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": LONG}}
        assert "result" in (await http.post(url, headers=headers, json=body)).json()
    return session


def _unread_stream(url: str, session: str) -> socket.socket:
    """The session's notification stream (a GET), opened and never read."""
    where = httpx.URL(url)
    assert where.host is not None
    assert where.port is not None
    stream = socket.socket()
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stream.connect((where.host, where.port))
    head = (
        f"GET {where.path} HTTP/1.1\r\nHost: {where.host}:{where.port}\r\nAccept: text/event-stream\r\n"
        f"Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {VERSION}\r\n\r\n"
    )
    stream.sendall(head.encode())
    return stream


async def test_a_client_not_reading_its_updates_holds_up_no_other_clients_updates() -> None:
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    async with (
        serving_upstream(recorder.build(lambda _: None)) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy", message_handler=on_message) as bystander,
    ):
        with warnings.catch_warnings(action="ignore", category=MCPDeprecationWarning):
            await bystander.subscribe_resource("note://mine")
        stream = _unread_stream(gw.url, await _subscribed_session(gw.url))
        try:
            for _ in range(FLOOD // 200):  # 8 KB each: far past what its socket holds
                await bystander.call_tool("rec__updates", {"uri": LONG, "times": 200})
            await bystander.call_tool("rec__updates", {"uri": "note://mine", "times": 1})
            with anyio.fail_after(BOUND):  # before: never, dropped behind the attacker's
                while "note://mine" not in updates:
                    await anyio.sleep(0.02)
            with anyio.fail_after(BOUND * 2):
                received = await anyio.to_thread.run_sync(_read_until_quiet, stream)
        finally:
            stream.close()
    # What its socket's buffers held, and the updates kept for it (QUEUED): not the flood.
    assert received < FLOOD // 2, f"{received} of {FLOOD} updates kept for a client reading none"


def _read_until_quiet(stream: socket.socket) -> int:
    """The updates ``stream`` carries until it has been quiet for a second."""
    stream.settimeout(1.0)
    data = b""
    try:
        while chunk := stream.recv(1 << 16):
            data += chunk
    except TimeoutError:
        pass
    return data.count(b"notifications/resources/updated")


STUCK = 16
"""The attacker's sessions whose streams are full: told one after another, 2 s each, they
held a later client's list change 32 s."""


async def test_a_clients_sessions_not_reading_hold_up_no_other_clients_list_changes() -> None:
    told = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told.set()

    upstreams = {"rec": {"url": "", "protocol": "legacy"}, "counter": python_upstream("counter.py")}
    async with serving_upstream(recorder.build(lambda _: None)) as url:
        upstreams["rec"]["url"] = url
        async with running_gateway({"upstreams": upstreams}) as gw:
            streams = [_unread_stream(gw.url, await _subscribed_session(gw.url)) for _ in range(STUCK)]
            try:
                async with Client(gw.url, mode="legacy") as filler:  # each stream's socket filled
                    await filler.call_tool("rec__updates", {"uri": LONG, "times": 1000})
                async with Client(gw.url, mode="legacy", message_handler=on_message) as bystander:
                    await bystander.call_tool("counter__add_tool", {"name": "fresh"})
                    with anyio.fail_after(BOUND / 2):
                        await told.wait()
            finally:
                for stream in streams:
                    stream.close()


async def test_a_clients_sessions_not_reading_keep_no_other_client_from_learning_its_subscription_lost() -> (
    None
):
    # An upstream session's end is told to each subscriber (read it again, subscribe again),
    # 16 at a time within 3 s: 16 stuck sessions took every turn for all of it, and a
    # bystander's subscription was gone without a word.
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    upstream = python_upstream("recorder.py", protocol="legacy")
    async with running_gateway({"upstreams": {"rec": upstream}}) as gw:
        streams = [_unread_stream(gw.url, await _subscribed_session(gw.url)) for _ in range(STUCK)]
        try:
            async with Client(gw.url, mode="legacy", message_handler=on_message) as bystander:
                await bystander.call_tool("rec__updates", {"uri": LONG, "times": 1000})
                with warnings.catch_warnings(action="ignore", category=MCPDeprecationWarning):
                    await bystander.subscribe_resource("note://mine")
                pid = (await bystander.call_tool("rec__whoami", {})).structured_content["pid"]  # type: ignore[index]
                os.kill(pid, signal.SIGKILL)
                with anyio.fail_after(BOUND):  # before: never
                    while "note://mine" not in updates:
                        await anyio.sleep(0.02)
        finally:
            for stream in streams:
                stream.close()
