"""An upstream's answer is never inflated: httpx2 decodes a gzip or deflate body without
bound, so a 1 MB answer grew the gateway by a gigabyte past every bound on message size (an
attack found it: 164 -> 2,387 MB, the bystander's p99 4.7 s). The gateway asks every HTTP
upstream for ``identity``, and an answer coded anyway is handed on as the bytes it is."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Scope, Send

from tests.faults.harness import text_of
from tests.support import RunningGateway, intercepted, running_gateway, serving

INFLATED = 64 * 2**20
"""What the coded answer inflates to: past the upstream's max_message_bytes (1 MiB) here."""


def coded_upstream(
    accepted: list[str], *, always: bool, refusing: bool = False, codings: tuple[bytes, ...] = (b"gzip",)
) -> ASGIApp:
    """A FastMCP upstream whose ``packed`` call is answered gzip-coded when the request
    accepts gzip (``always``: whatever it accepts), a body that inflates to 64 MiB (an HTTP
    500 whose JSON-RPC error does, when ``refusing``); else as FastMCP answers it.
    ``accepted``: each call's Accept-Encoding; ``codings``: its Content-Encoding headers."""
    server = FastMCP("coded")
    server.tool(lambda: "plain", name="packed")

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        if request.get("method") != "tools/call":
            return False
        accept = dict(scope["headers"]).get(b"accept-encoding", b"").decode()
        accepted.append(accept)
        if always or "gzip" in accept:
            await (_refusal_bomb if refusing else _bomb)(send, request["id"], codings)
            return True
        return False

    return intercepted(server, intercept)


async def _bomb(send: Send, request_id: object, codings: tuple[bytes, ...]) -> None:
    text = "A" * INFLATED
    answer = {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}]}}
    coded = gzip.compress(json.dumps(answer).encode(), compresslevel=9)
    headers = [(b"content-type", b"application/json"), *((b"content-encoding", c) for c in codings)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": coded})


async def _refusal_bomb(send: Send, request_id: object, codings: tuple[bytes, ...]) -> None:
    """An HTTP 500 whose JSON-RPC error says ``inflated``, padded with whitespace to 64 MiB."""
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": "inflated"}}
    coded = gzip.compress(json.dumps(error).encode() + b" " * INFLATED, compresslevel=9)
    headers = [(b"content-type", b"application/json"), *((b"content-encoding", c) for c in codings)]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": coded})


@asynccontextmanager
async def gateway_over(upstream: ASGIApp, protocol: str = "legacy") -> AsyncIterator[RunningGateway]:
    async with serving(upstream) as base:
        config = {"url": f"{base}/mcp", "protocol": protocol, "max_message_bytes": 2**20}
        async with running_gateway({"upstreams": {"coded": config}}) as gw:
            yield gw


@pytest.mark.parametrize("protocol", ["legacy", "auto"])  # the SDK's client; the forwarder below it
async def test_every_call_asks_for_an_uncoded_answer_and_gets_one(protocol: str) -> None:
    accepted: list[str] = []
    upstream = coded_upstream(accepted, always=False)
    async with gateway_over(upstream, protocol) as gw, Client(gw.url) as client:
        result = await client.call_tool("coded__packed", {})
    assert not result.is_error
    assert result.content[0].text == "plain"  # type: ignore[union-attr]
    assert accepted == ["identity"]  # before: "gzip, deflate, zstd": the bomb, inflated


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_answer_coded_unasked_fails_its_call_uninflated(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway_over(coded_upstream([], always=True)) as gw, Client(gw.url, mode=mode) as client:
        result = await client.call_tool("coded__packed", {})
        assert result.is_error  # before: 64 MiB inflated and parsed past the 1 MiB bound
        assert (await client.call_tool("coded__packed", {})).is_error  # the upstream is still up
    assert any("coded 'gzip', unasked: not decoded" in r.getMessage() for r in caplog.records)


async def test_a_coded_refusal_of_a_forwarded_call_is_not_inflated(caplog: pytest.LogCaptureFixture) -> None:
    # A modern-era upstream's calls are posted on the gateway's own connections (``wire.py``),
    # and an HTTP error's body is read whole for its JSON-RPC error: httpx2 inflated it there,
    # past max_message_bytes (1 MiB here) and the bound of bytes in flight, which count the
    # bytes received (a 2 MB gzip body took the gateway process to 4.3 GB, its bystander's
    # p50 to 11.8 s). Now read as the bytes it is: no JSON-RPC error in it.
    upstream = coded_upstream([], always=True, refusing=True)
    async with gateway_over(upstream, "auto") as gw, Client(gw.url) as client:
        result = await client.call_tool("coded__packed", {})
        assert result.is_error
        assert "inflated" not in text_of(result)  # before: the inflated body's error, read
        assert "Server returned an error response" in text_of(result)
        assert (await client.call_tool("coded__packed", {})).is_error  # the upstream is still up
    assert any("coded 'gzip', unasked: not decoded" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("refusing", [False, True])  # a result on the SDK's path; a refusal forwarded
async def test_an_answer_coded_in_a_second_header_is_not_inflated(
    refusing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Content-Encoding: identity, then Content-Encoding: gzip. Only the first header was read
    # ("identity": kept as it was), and httpx2 reads both: the body was inflated, 64 MiB past
    # max_message_bytes (1 MiB).
    upstream = coded_upstream([], always=True, refusing=refusing, codings=(b"identity", b"gzip"))
    async with gateway_over(upstream, "auto" if refusing else "legacy") as gw, Client(gw.url) as client:
        result = await client.call_tool("coded__packed", {})
        assert result.is_error
        assert "inflated" not in text_of(result)
        assert (await client.call_tool("coded__packed", {})).is_error  # the upstream is still up
    assert any("unasked: not decoded" in r.getMessage() for r in caplog.records)
