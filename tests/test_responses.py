"""How the gateway answers a handshake-era POST: JSON for a silent call, a stream otherwise."""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Context, FastMCP

from agent_gateway.compat import deferred as responses
from tests.support import RunningGateway, intercepted, running_gateway, serving, serving_upstream

BOUND = 10.0
VERSION = "2025-11-25"


def upstream() -> FastMCP:
    server = FastMCP("steps")

    @server.tool
    def echo(text: str) -> str:
        return text

    @server.tool
    async def steps(count: int, ctx: Context) -> str:
        for step in range(1, count + 1):
            await ctx.report_progress(step, count)
        return f"{count} steps"

    @server.tool
    async def chatty(ctx: Context) -> str:
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await ctx.info("working on it")
        return "said it"

    @server.tool
    async def slow(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "slept"

    return server


@dataclass
class Answer:
    content_type: str
    messages: list[dict[str, Any]]


@dataclass
class Session:
    """A handshake-era client speaking raw HTTP, to see each answer's media type."""

    http: httpx.AsyncClient
    gw: RunningGateway
    session_id: str = ""
    content_type: str = "application/json"

    def headers(self) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream", "content-type": self.content_type}
        if self.session_id:
            headers |= {"mcp-session-id": self.session_id, "mcp-protocol-version": VERSION}
        return headers

    async def post(self, message: dict[str, Any]) -> Answer:
        response = await self.http.post(
            self.gw.url, json={"jsonrpc": "2.0", **message}, headers=self.headers()
        )
        content_type = response.headers.get("content-type", "").split(";")[0]
        if response.status_code == 202:  # a notification's acknowledgement
            return Answer(content_type, [])
        if content_type == "application/json":
            return Answer(content_type, [response.json()])
        return Answer(content_type, events(response.text))

    async def call(self, tool: str, arguments: dict[str, Any], **meta: Any) -> Answer:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        return await self.post({"id": tool, "method": "tools/call", "params": params})


def events(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages in an SSE body (``data:`` lines; pings and priming skipped)."""
    found = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if data:
            found.append(json.loads(data))
    return found


@asynccontextmanager
async def session(content_type: str = "application/json") -> AsyncIterator[Session]:
    async with (
        serving_upstream(upstream()) as url,
        running_gateway({"upstreams": {"up": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        client = Session(http, gw, content_type=content_type)
        init = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        response = await http.post(
            gw.url,
            json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
            headers=client.headers(),
        )
        assert response.status_code == 200, response.text
        client.session_id = response.headers["mcp-session-id"]
        await client.post({"method": "notifications/initialized"})
        yield client


async def test_a_call_that_sends_nothing_before_its_result_is_answered_with_one_json_body() -> None:
    async with session() as client:
        answer = await client.call("up__echo", {"text": "hi"})
    assert answer.content_type == "application/json"
    [result] = answer.messages
    assert result["id"] == "up__echo"
    assert result["result"]["content"][0]["text"] == "hi"


@pytest.mark.parametrize("content_type", ["APPLICATION/JSON", "Application/Json; Charset=UTF-8"])
async def test_a_json_body_is_read_whatever_the_case_of_its_media_type(content_type: str) -> None:
    # Media types are case-insensitive (RFC 9110 8.3.1): the SDK's handshake-era transport
    # answered these 415, the session never opened (the modern era's were served).
    async with session(content_type) as client:
        answer = await client.call("up__echo", {"text": "hi"})
    assert answer.messages[0]["result"]["content"][0]["text"] == "hi"


async def test_a_tool_error_is_a_json_body_too() -> None:
    async with session() as client:
        answer = await client.call("up__echo", {"text": 42})
    assert answer.content_type == "application/json"
    assert answer.messages[0]["result"]["isError"] is True


async def test_progress_before_the_result_commits_a_stream_with_everything_in_order() -> None:
    async with session() as client:
        answer = await client.call("up__steps", {"count": 2}, progressToken="p1")
    assert answer.content_type == "text/event-stream"
    methods = [m.get("method", "result") for m in answer.messages]
    assert methods == ["notifications/progress", "notifications/progress", "result"]
    assert [m["params"]["progress"] for m in answer.messages[:2]] == [1, 2]
    assert all(m["params"]["progressToken"] == "p1" for m in answer.messages[:2])
    assert answer.messages[2]["result"]["content"][0]["text"] == "2 steps"


async def test_a_log_line_before_the_result_commits_a_stream() -> None:
    async with session() as client:
        answer = await client.call("up__chatty", {})
    assert answer.content_type == "text/event-stream"
    log, result = answer.messages
    assert log["method"] == "notifications/message"
    assert log["params"]["data"]["msg"] == "working on it"
    assert result["result"]["content"][0]["text"] == "said it"


async def test_a_call_silent_past_the_keepalive_interval_is_answered_on_a_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A proxy between client and gateway may cut a response idle for long: after the
    # interval the stream is committed so keepalive pings can flow, as the SDK would.
    monkeypatch.setattr(responses, "PING_INTERVAL", 0.2)
    async with session() as client:
        answer = await client.call("up__slow", {"seconds": 0.6})
    assert answer.content_type == "text/event-stream"
    assert answer.messages[-1]["result"]["content"][0]["text"] == "slept"


@asynccontextmanager
async def slow_call_in_flight(client: Session) -> AsyncIterator[Callable[[], Awaitable[Answer]]]:
    """A 30 s call, in flight upstream on entry; the context yields a wait for its answer."""
    answers: list[Answer] = []
    answered = anyio.Event()

    async def call() -> None:
        answers.append(await client.call("up__slow", {"seconds": 30}))
        answered.set()

    async def answer() -> Answer:
        with anyio.fail_after(BOUND):
            await answered.wait()
        return answers[0]

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.fail_after(BOUND):
            while not client.gw.gateway.status()["pending_calls"]:
                await anyio.sleep(0.01)
        yield answer


async def test_a_cancelled_call_is_answered_on_a_stream_as_the_sdk_answers_it() -> None:
    async with session() as client, slow_call_in_flight(client) as answered:
        cancel = {"requestId": "up__slow", "reason": "changed my mind"}
        await client.post({"method": "notifications/cancelled", "params": cancel})
        answer = await answered()
    assert answer.content_type == "text/event-stream"
    assert answer.messages[-1]["error"]["code"] == -32800


async def test_a_call_whose_session_ends_meanwhile_gets_a_stream_that_ends_unanswered() -> None:
    # As the SDK's stream would end: the client reads "connection closed", not an HTTP error.
    async with session() as client, slow_call_in_flight(client) as answered:
        ended = await client.http.delete(client.gw.url, headers=client.headers())
        assert ended.status_code == 200
        answer = await answered()
    assert answer.content_type == "text/event-stream"
    assert answer.messages == []


async def test_a_request_sent_right_behind_initialize_is_served_once_the_handshake_is_done() -> None:
    """A client may send its session's first request as soon as ``initialize``'s stream has
    named the session, before its answer: the SDK's loop holds it until the handshake is done,
    and so must the gateway (served in its POST's task at once, it was refused as sent before
    initialization). The handshake is held open here by the upstream: a second client's
    ``initialize`` takes back the first's quiet log level, which the upstream is slow to take."""

    async def slow_to_take_levels(scope: Any, message: dict[str, Any], send: Any) -> bool:
        if message.get("method") == "logging/setLevel" and message["params"]["level"] != "error":
            await anyio.sleep(0.5)
        return False

    hello = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
    async with (
        serving(intercepted(upstream(), slow_to_take_levels)) as base,
        running_gateway({"upstreams": {"up": {"url": f"{base}/mcp", "protocol": "legacy"}}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        quiet = Session(http, gw)
        opened = await http.post(gw.url, json=initialize, headers=quiet.headers())
        quiet.session_id = opened.headers["mcp-session-id"]
        await quiet.post({"method": "notifications/initialized"})
        await quiet.post({"id": 1, "method": "logging/setLevel", "params": {"level": "error"}})
        eager = Session(http, gw)
        async with http.stream("POST", gw.url, json=initialize, headers=eager.headers()) as handshake:
            eager.session_id = handshake.headers["mcp-session-id"]  # its answer not yet sent
            listed = await eager.post({"id": 1, "method": "tools/list"})
            answered = events((await handshake.aread()).decode())
    assert answered[0]["result"]["protocolVersion"] == VERSION
    assert "up__echo" in {tool["name"] for tool in listed.messages[0]["result"]["tools"]}
