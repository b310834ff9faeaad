"""An upstream that answers a call with noise (what makes no message: comments, blank lines,
lines that do not parse) costs the gateway only that call, briefly, on every transport: the
call fails saying why, a bystander calling another upstream is served throughout, and the
upstream's connection is let go as for any broken upstream. Last round bounded the modern
era's answer stream (``test_stream_noise.py``); these are the other transports."""

from __future__ import annotations

import json

import anyio
import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.upstreams import stdio_process
from tests.faults.harness import faulty_stdio, gateway_under_fault, text_of, wait_until
from tests.faults.test_stream_noise import FLOOD, WAIT, dripping, kit
from tests.support import serving

CHUNK = b":\n" * 32768


def drip_kit() -> FastMCP:
    server = kit()

    @server.tool
    async def drip() -> str:
        """Never answers (its noise is written by the layer in front)."""
        await anyio.sleep_forever()
        return "never"

    return server


async def test_a_handshake_era_calls_answer_stream_of_comments_fails_the_call_and_a_bystander_is_served() -> (
    None
):
    # The SDK's transport read the POST's answer stream through httpx2's EventSource, under no
    # noise bound: comments without end were parsed until the call's timeout (60 s here), the
    # gateway's CPU spent all along.
    sent = list[int]()
    async with serving(dripping(drip_kit(), sent)) as base:
        upstream = {"url": f"{base}/mcp", "protocol": "legacy", "timeout": 60}
        async with gateway_under_fault({"up": upstream}) as faulted, Client(faulted.gw.url) as client:
            with anyio.fail_after(WAIT):
                dripped = await client.call_tool("up__drip", {})
            assert dripped.is_error
            assert "made no message" in text_of(dripped), text_of(dripped)
            assert text_of(await client.call_tool("up__ping", {})) == "pong"
            await wait_until(lambda: bool(sent), WAIT)  # the upstream's writes end once let go
    assert sent[0] < FLOOD // 4, sent  # let go (the socket buffers hold a few MiB more), not read on


def flooding_on_drip(server: FastMCP, sent: list[int]) -> ASGIApp:
    """``server`` over the legacy SSE transport, its session's stream flooded with comments from
    the moment a call of ``drip`` is posted (the bytes written before the gateway let go of
    the stream kept in ``sent``)."""
    app = server.http_app(transport="sse", path="/sse")
    dripped = anyio.Event()

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            return await app(scope, await posted(receive, dripped), send)
        if scope["type"] != "http" or scope["method"] != "GET":
            return await app(scope, receive, send)
        written, begun = [0], anyio.Event()

        async def begins(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body":  # its endpoint event: the stream is open
                begun.set()

        async def flood() -> None:
            await begun.wait()
            await dripped.wait()
            while written[0] < FLOOD and not gone:
                await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
                written[0] += len(CHUNK)

        gone: list[int] = []

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not gone:
                gone.append(written[0])  # when the gateway let go of the stream
            return message

        async with anyio.create_task_group() as tg:
            if not sent:  # the first stream only: the one reconnected to is left alone
                tg.start_soon(flood)
            try:
                await app(scope, watched, begins)
            finally:
                tg.cancel_scope.cancel()
                if dripped.is_set() and not sent:
                    sent.append(gone[0] if gone else written[0])

    return upstream


async def posted(receive: Receive, dripped: anyio.Event) -> Receive:
    """``receive`` with the POST's body read first: a call of ``drip`` sets ``dripped``."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if json.loads(body).get("params", {}).get("name") == "drip":
        dripped.set()
    unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return unread.pop() if unread else await receive()

    return replayed


async def test_a_legacy_sse_stream_of_comments_fails_its_calls_and_a_bystander_is_served() -> None:
    # The SDK's legacy SSE reader parsed the stream's comments, unbounded, until the call's
    # timeout (60 s here): the gateway's CPU spent all along, the upstream reported up.
    sent = list[int]()
    async with serving(flooding_on_drip(drip_kit(), sent)) as base:
        upstream = {"url": f"{base}/sse", "transport": "sse", "protocol": "legacy", "timeout": 60}
        upstream |= {"retry": {"initial_delay": 0.05, "max_delay": 0.1}}
        async with gateway_under_fault({"up": upstream}) as faulted, Client(faulted.gw.url) as client:
            with anyio.fail_after(WAIT):
                dripped = await client.call_tool("up__drip", {})
            assert dripped.is_error
            assert "made no message" in text_of(dripped), text_of(dripped)
            await wait_until(lambda: bool(sent), WAIT)  # the upstream's writes end once let go
            session = faulted.gw.gateway.pool.get("up")
            await wait_until(lambda: session.connections == 2 and session.state == "up", WAIT)
            assert text_of(await client.call_tool("up__ping", {})) == "pong"  # reconnected
    assert sent[0] < FLOOD // 4, sent


@pytest.mark.parametrize("line", ["", "not json"], ids=["blank", "not-json-rpc"])
async def test_a_stdio_upstreams_lines_of_noise_without_end_fail_its_calls_and_it_is_restarted(
    line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each blank line was split off and dropped, each unparseable one parsed, reported and
    # handed to the session (100,000 of them took 4.6 s of the gateway's CPU), without bound:
    # the call waited its whole timeout (60 s here). The upstream, still writing, is given a
    # moment, not the 2 s of grace, to exit on its own before it is ended and restarted.
    monkeypatch.setattr(stdio_process, "PROCESS_TERMINATION_TIMEOUT", 0.2)
    async with (
        gateway_under_fault({"faulty": faulty_stdio(timeout=60)}) as faulted,
        Client(faulted.gw.url) as client,
    ):
        with anyio.fail_after(WAIT):
            noisy = await client.call_tool("faulty__noise", {"lines": 10_000_000, "line": line})
        assert noisy.is_error
        assert "made no message" in text_of(noisy), text_of(noisy)
        session = faulted.gw.gateway.pool.get("faulty")
        await wait_until(lambda: session.connections == 2 and session.state == "up", WAIT)
        assert text_of(await client.call_tool("faulty__ping", {})) == "pong"  # restarted


async def test_a_stdio_upstreams_start_up_banner_of_2000_lines_is_not_taken_for_noise() -> None:
    # A server that prints its start-up (a banner, its progress loading) to stdout before
    # serving: 2,000 lines, 92 KB, none a message, ahead of its answer to ``initialize``. Once
    # bounded as noise past 1,024 lines (or 64 KiB), its session was lost before it answered,
    # at every restart: the upstream never came up. Before the bound, the lines were dropped.
    banner = faulty_stdio(env={"FAULTY_BANNER": "2000"})
    async with gateway_under_fault({"banner": banner}) as faulted, Client(faulted.gw.url) as client:
        session = faulted.gw.gateway.pool.get("banner")
        await wait_until(lambda: session.state == "up", WAIT)
        with anyio.fail_after(WAIT):
            assert text_of(await client.call_tool("banner__ping", {})) == "pong"
        assert session.connections == 1  # never lost (and restarted) for its banner


async def test_a_stdio_upstreams_oversized_notification_is_dropped_not_taken_for_noise() -> None:
    # A notification over max_message_bytes has no id to answer: it is dropped, saying why, as
    # before the noise bound. Counted as noise by its size, one of them (64 KiB past the bound)
    # lost the session and failed every call in flight on it, the process restarted.
    upstream = faulty_stdio(max_message_bytes=1 << 20)
    async with gateway_under_fault({"faulty": upstream}) as faulted, Client(faulted.gw.url) as client:
        with anyio.fail_after(WAIT):
            noted = await client.call_tool("faulty__oversized_note", {"size": 2 << 20})
        assert text_of(noted) == "answered", text_of(noted)
        assert faulted.gw.gateway.pool.get("faulty").connections == 1  # never lost


async def test_a_stdio_upstream_ending_each_message_with_a_blank_line_is_not_taken_for_noise() -> None:
    # A read's blank lines were counted after all of its messages, as if none came between
    # them: 2,500 short notifications each followed by a blank line (two thousand in a read
    # of the pipe's 64 KiB) lost the session, and the call with it.
    async with gateway_under_fault({"faulty": faulty_stdio()}) as faulted, Client(faulted.gw.url) as client:
        with anyio.fail_after(WAIT):
            assert text_of(await client.call_tool("faulty__spaced", {"count": 2500})) == "spaced"
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
        assert faulted.gw.gateway.pool.get("faulty").connections == 1  # never lost
