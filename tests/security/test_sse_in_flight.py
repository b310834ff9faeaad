"""A legacy SSE upstream's (``transport: sse``) unfinished event counts against the process's
bound of bytes in flight (``answer.CountedEvents``), as a Streamable HTTP upstream's does: its
stream is read by the SDK's own HTTP client, not the gateway's transport, and several such
upstreams each holding an event of up to ``max_message_bytes`` added up past the bound."""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
import anyio.lowlevel
import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.in_flight import IN_FLIGHT
from tests.faults.harness import text_of
from tests.support import running_gateway, serving, serving_upstream

WAIT = 30.0
BOUND = 48 * 2**20
EVENT = 20 * 2**20
"""An unfinished event's bytes: two fit ``BOUND``, three do not."""


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.02)


async def first(*events: anyio.Event) -> None:
    """Until one of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def endless_event(ended: anyio.Event, cut: list[int]) -> ASGIApp:
    """FastMCP's legacy SSE app whose stream, once its ``flood`` tool is called, sends
    ``EVENT`` bytes of one event that never ends (what the app would send after it waits until
    ``ended``); each stream the gateway closed before then adds its bytes sent to ``cut``."""
    server = FastMCP("endless")
    server.tool(lambda: "never sent", name="flood")
    inner = server.http_app(path="/sse", transport="sse")
    streams: list[anyio.Event] = []
    """Each stream's signal to start its event: the latest is the session's."""

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            body = b"".join([(await receive()).get("body", b"")])  # one message: FastMCP's size
            if b'"name":"flood"' in body.replace(b" ", b"") and streams:
                streams[-1].set()
                await send({"type": "http.response.start", "status": 202, "headers": []})
                await send({"type": "http.response.body", "body": b"Accepted"})
                return None
            unread = [{"type": "http.request", "body": body, "more_body": False}]

            async def replayed() -> Message:
                return unread.pop() if unread else await receive()  # pyright: ignore[reportReturnType]

            return await inner(scope, replayed, send)
        if scope["type"] != "http" or scope["method"] != "GET":
            return await inner(scope, receive, send)
        start = anyio.Event()
        streams.append(start)

        async def held(message: Message) -> None:
            if start.is_set():  # the event is being sent: nothing else may end it
                await ended.wait()
            await send(message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(inner, scope, receive, held)  # answers the session's POSTs
            # A stream never started (the gateway's reconnect after the cut) ends with the
            # test: waiting on, it held its server's shutdown, and the test, without end.
            await first(start, ended)
            if not start.is_set():
                tg.cancel_scope.cancel()
                return
            sent = 0
            await send({"type": "http.response.body", "body": b"event: message\ndata: ", "more_body": True})
            for _ in range(EVENT // 2**20):
                await send({"type": "http.response.body", "body": b"x" * 2**20, "more_body": True})
                sent += 2**20
                await anyio.lowlevel.checkpoint()
            async with anyio.create_task_group() as waiting:

                async def end() -> None:
                    await ended.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(end)
                while (await receive())["type"] != "http.disconnect":
                    pass
                cut.append(sent)
                waiting.cancel_scope.cancel()
            tg.cancel_scope.cancel()

    return upstream


# FastMCP's SSE app, cancelled here mid-stream, leaves its memory streams to the collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_the_unfinished_event_of_a_legacy_sse_stream_counts_in_flight() -> None:
    ended, cut = anyio.Event(), list[int]()
    healthy = FastMCP("healthy")
    healthy.tool(lambda: "pong", name="ping")
    try:
        async with AsyncExitStack() as stack:
            upstreams: dict[str, object] = {
                "healthy": {"url": await stack.enter_async_context(serving_upstream(healthy))}
            }
            for n in range(3):
                base = await stack.enter_async_context(serving(endless_event(ended, cut)))
                upstreams[f"sse{n}"] = {"url": f"{base}/sse", "transport": "sse", "protocol": "legacy"}
            config = {"server": {"max_bytes_in_flight": BOUND}, "upstreams": upstreams}
            gw = await stack.enter_async_context(running_gateway(config))
            stack.callback(ended.set)  # before the gateway and the upstreams stop
            client = await stack.enter_async_context(Client(gw.url))
            async with anyio.create_task_group() as tg:
                for n in range(3):
                    tg.start_soon(client.call_tool, f"sse{n}__flood", {})
                # Two streams' events are held, counted; the third's does not fit: its stream is cut.
                await until(lambda: IN_FLIGHT.held >= 2 * EVENT and bool(cut))
                assert len(cut) == 1, cut
                assert text_of(await client.call_tool("healthy__ping", {})) == "pong"
                tg.cancel_scope.cancel()
    finally:
        ended.set()
    gc.collect()  # here, where they are expected: collected in a later test, they failed it
    assert IN_FLIGHT.held == 0
