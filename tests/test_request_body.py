"""A body past ``server.max_body_bytes`` that carries a session id: read for an answer's id
(``request_body.answered_id``), and refused 413 whatever that read finds."""

from __future__ import annotations

import json

import anyio
import httpx
import mcp_types as types
from mcp import Client

from tests.support import answer_before_the_body_ends, python_upstream, running_gateway

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


async def _session_of(url: str) -> str:
    """The id of a handshake-era session opened at ``url`` (left open)."""
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}
    async with httpx.AsyncClient(timeout=30) as http:
        opened = await http.post(
            url, headers=HEADERS, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        )
    return opened.headers["mcp-session-id"]
