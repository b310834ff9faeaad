"""A body past ``server.max_body_bytes`` that carries a session id: read for an answer's id
(``request_body.answered_id``), and refused 413 whatever that read finds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import mcp_types as types
import pytest
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client

from tests.support import RawAnswer, answer_before_the_body_ends, python_upstream, running_gateway

HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_an_oversized_answer_whose_id_is_no_json_is_refused_413_not_a_500() -> None:
    # The id's text matched the pattern, but json.loads refused it: an exception, a 500 and a
    # traceback for any client that sent one (the session id need name no session).
    config = {"server": {"max_body_bytes": 65536}, "upstreams": {"counter": python_upstream("counter.py")}}
    async with running_gateway(config) as gw:
        for spelled in (rb'"\x"', b"01", b'"a\nb"'):
            chunk = b'{"jsonrpc":"2.0","id":' + spelled + b',"result":{"a":"' + b"x" * 70000
            with anyio.fail_after(10):
                answer = await answer_before_the_body_ends(
                    gw.url,
                    {**HEADERS, "Mcp-Session-Id": "0" * 32, "Transfer-Encoding": "chunked"},
                    f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n",
                )
            assert answer.status == 413, (spelled, answer)
            assert "the limit (server.max_body_bytes) is 65536" in json.loads(answer.body)["error"]["message"]
        async with Client(gw.url) as client:  # and the gateway serves on
            assert text_of(await client.call_tool("counter__increment", {})) == "1"


async def test_a_declared_length_past_the_limit_whose_head_never_comes_is_refused_413() -> None:
    # With its session's id the gateway reads the body's first chunk for an answer's id; when
    # none came within the body timeout the client was told 408, its body "did not arrive",
    # though it was refused for its declared size.
    server = {"max_body_bytes": 65536, "connections": {"body_timeout": 1}}
    async with running_gateway({"server": server, "upstreams": {}}) as gw:
        session = await _session_of(gw.url)
        with anyio.fail_after(10):
            answer = await answer_before_the_body_ends(
                gw.url, {**HEADERS, "Mcp-Session-Id": session, "Content-Length": "100000000"}
            )
    assert answer.status == 413, answer
    message = json.loads(answer.body)["error"]["message"]
    assert message == "request body is 100000000 bytes; the limit (server.max_body_bytes) is 65536"


async def test_a_declared_length_past_the_limit_naming_no_session_here_is_refused_unread() -> None:
    # Its head was waited for (up to the body timeout) whatever session the id named: only a
    # session this replica holds for the request's credential can be asked a question.
    server = {"max_body_bytes": 65536, "connections": {"body_timeout": 120}}
    async with running_gateway({"server": server, "upstreams": {}}) as gw:
        with anyio.fail_after(60):  # a hang's bound: the body timeout is 120 s
            answer = await answer_before_the_body_ends(
                gw.url, {**HEADERS, "Mcp-Session-Id": "0" * 32, "Content-Length": "100000000"}
            )
    assert answer.status == 413, answer


async def _session_of(
    url: str, capabilities: dict[str, Any] | None = None, headers: Mapping[str, str] = HEADERS
) -> str:
    """The id of a handshake-era session opened at ``url`` with ``headers`` (left open), initialized."""
    hello = {
        "protocolVersion": "2025-06-18",
        "capabilities": capabilities or {},
        "clientInfo": {"name": "x", "version": "0"},
    }
    async with httpx.AsyncClient(timeout=30) as http:
        opened = await http.post(
            url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        )
        session = opened.headers["mcp-session-id"]
        headers = {**headers, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"}
        await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return session


@pytest.mark.parametrize("framing", ["declared", "chunked"])
async def test_an_oversized_answer_whose_id_comes_after_a_small_first_chunk_fails_its_question_at_once(
    framing: str,
) -> None:
    # The id was looked for in the body's first chunk only: a client whose first chunk held ten
    # bytes had its sampling question wait out the model's timeout (60 s), then say it had no answer.
    agent = {"memory": {"store": "memory"}, "model": {"provider": "sampling", "timeout": 60}}
    config = {"server": {"max_body_bytes": 65536}, "upstreams": {}, "agent": agent}
    async with (
        running_gateway(config) as gw,
        httpx.AsyncClient(timeout=30) as http,
        _asked_to_sample(http, gw.url, HEADERS) as (headers, asked, events),
    ):
        answer = b'{"jsonrpc":"2.0","id":' + json.dumps(asked["id"]).encode()
        answer += b',"result":{"role":"assistant","model":"m","content":{"type":"text","text":"'
        refused = await _posted_in_two_chunks(gw.url, headers, framing, answer + b"x" * 70000)
        result = await _next_message(events)
    assert refused.status == 413, refused
    told = result["result"]["content"][0]["text"]
    assert "the client's answer was not read: its request body is " in told, result


async def test_an_oversized_answer_under_another_credential_fails_no_question_of_the_session() -> None:
    # Only a session's own credential answers its questions: another's body past the limit,
    # naming the session and a question's id, must not fail that question as unread.
    tokens = [{"name": who, "token": f"{who}-token-0123456789abcdef"} for who in ("alice", "bob")]
    auth = {"mode": "bearer", "tokens": tokens, "policies": {"default": {}}}
    agent = {"memory": {"store": "memory"}, "model": {"provider": "sampling", "timeout": 60}}
    config = {"server": {"max_body_bytes": 65536}, "upstreams": {}, "agent": agent, "auth": auth}
    alice = {**HEADERS, "Authorization": "Bearer alice-token-0123456789abcdef"}
    async with (
        running_gateway(config) as gw,
        httpx.AsyncClient(timeout=30) as http,
        _asked_to_sample(http, gw.url, alice) as (headers, asked, events),
    ):
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": asked["id"]}
        bobs = {**headers, "Authorization": "Bearer bob-token-0123456789abcdef"}
        start = json.dumps(answer).encode()[:-1] + b',"result":{"role":"assistant","model":"m"'
        refused = await answer_before_the_body_ends(  # past the head the gateway reads
            gw.url, {**bobs, "Content-Length": "100000000"}, start + b',"x":"' + b"x" * 2048
        )
        content = {"type": "text", "text": "answered by alice"}
        answer["result"] = {"role": "assistant", "model": "m", "content": content}
        assert (await http.post(gw.url, headers=headers, json=answer)).status_code == 202
        result = await _next_message(events)
    assert refused.status == 413, refused
    told = result["result"]["content"][0]["text"]
    assert "answered by alice" in told, result


async def _posted_in_two_chunks(url: str, headers: Mapping[str, str], framing: str, body: bytes) -> RawAnswer:
    """``body`` POSTed to ``url`` on a raw socket: its first ten bytes, then (once the server has
    taken them from its socket) the rest of its first kilobyte (and, chunked, of the body)."""
    parsed = urlsplit(url)
    if framing == "declared":
        fields, pieces = {"Content-Length": str(len(body))}, (body[:10], body[10:1024])
    else:
        fields, pieces = {"Transfer-Encoding": "chunked"}, (_chunk(body[:10]), _chunk(body[10:]))
    head = [f"POST {parsed.path} HTTP/1.1", f"Host: {parsed.netloc}"]
    head += [f"{k}: {v}" for k, v in {**headers, **fields}.items()]
    async with await anyio.connect_tcp("127.0.0.1", parsed.port or 80) as stream:
        await stream.send("\r\n".join([*head, "", ""]).encode() + pieces[0])
        await _taken(stream.extra(SocketAttribute.local_port))
        await stream.send(pieces[1])
        received = BufferedByteReceiveStream(stream)
        status_line, *lines = (await received.receive_until(b"\r\n\r\n", 65536)).decode().split("\r\n")
        length = next(int(f.split(":", 1)[1]) for f in lines if f.lower().startswith("content-length:"))
        return RawAnswer(int(status_line.split()[1]), await received.receive_exactly(length))


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _taken(client_port: int) -> None:
    """Wait until the server's end of the connection from ``client_port`` holds no unread bytes
    (the caller bounds the wait)."""
    while True:
        for row in (await anyio.Path("/proc/net/tcp").read_text()).splitlines()[1:]:
            fields = row.split()
            if int(fields[2].split(":")[1], 16) == client_port and int(fields[4].split(":")[1], 16) == 0:
                return
        await anyio.sleep(0.01)


@asynccontextmanager
async def _asked_to_sample(
    http: httpx.AsyncClient, url: str, headers: Mapping[str, str]
) -> AsyncIterator[tuple[dict[str, str], dict[str, Any], AsyncIterator[str]]]:
    """A session opened with ``headers`` that can sample, its ``ask_agent`` call in flight and
    its model's question asked: the session's headers, the question, the call's stream."""
    session = await _session_of(url, {"sampling": {}}, headers)
    headers = {**headers, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call["params"] = {"name": "ask_agent", "arguments": {"query": "Hi"}}
    with anyio.fail_after(20):  # the question's own timeout is 60 s
        async with http.stream("POST", url, headers=headers, json=call) as stream:
            events = aiter(stream.aiter_lines())
            asked = await _next_message(events)
            assert asked["method"] == "sampling/createMessage", asked
            yield headers, asked, events


async def _next_message(lines: AsyncIterator[str]) -> dict[str, Any]:
    """The next JSON-RPC message of an SSE stream."""
    async for line in lines:
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    raise AssertionError("the stream ended")
