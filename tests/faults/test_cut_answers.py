"""An HTTP upstream's answer to one call that ends before its result (an SSE stream closed
early, a JSON body cut short), or whose result does not match its tool's output schema, fails
that call alone, with an error naming the upstream. Before, it was taken as the upstream's
connection lost: the upstream was marked down and reconnected, every other client's calls to
it failed meanwhile ("not connected"), and a client could repeat it at will."""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.types import ASGIApp, Scope, Send

from agent_gateway.upstreams.connection import UpstreamState
from tests.faults.harness import text_of
from tests.support import intercepted, running_gateway, serving


def cutting_upstream() -> ASGIApp:
    """A FastMCP upstream whose ``stream_cut`` and ``body_cut`` calls are answered with an
    SSE stream that ends without a result and a JSON body shorter than its length."""
    server = FastMCP("cutting")
    server.tool(lambda text: text, name="echo")
    server.tool(lambda: "whole", name="stream_cut")
    server.tool(lambda: "whole", name="body_cut")

    @server.tool
    def shapeless() -> dict[str, int]:
        """Declares an output schema; its answer (below) carries no structured content."""
        return {"a": 1}

    return intercepted(server, _misanswered)


async def _misanswered(scope: Scope, request: dict[str, Any], send: Send) -> bool:
    name = (request.get("params") or {}).get("name")
    if name == "stream_cut":
        await _start(send, [(b"content-type", b"text/event-stream")])
        await send({"type": "http.response.body", "body": b": nothing to say\n\n"})
    elif name == "body_cut":
        await _start(send, [(b"content-type", b"application/json"), (b"content-length", b"500")])
        await send({"type": "http.response.body", "body": b'{"jsonrpc": "2.0"'})
    elif name == "shapeless":
        result = {"content": [{"type": "text", "text": "a"}]}
        await _start(send, [(b"content-type", b"application/json")])
        answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()
        await send({"type": "http.response.body", "body": answer})
    else:
        return False
    return True


async def _start(send: Send, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": headers})


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_an_answer_cut_short_fails_its_call_alone(protocol: str) -> None:
    failures: list[str] = []
    async with (
        serving(cutting_upstream()) as base,
        running_gateway({"upstreams": {"cutting": {"url": f"{base}/mcp", "protocol": protocol}}}) as gw,
        Client(gw.url) as attacker,
        Client(gw.url) as bystander,
        anyio.create_task_group() as tg,
    ):
        done = anyio.Event()

        async def calls() -> None:
            while not done.is_set():
                result = await bystander.call_tool("cutting__echo", {"text": "hi"})
                if result.is_error:
                    failures.append(text_of(result))

        tg.start_soon(calls)
        for _ in range(4):  # past the breaker's bound of 5 in a row if counted: 8 in all
            for tool in ("cutting__stream_cut", "cutting__body_cut"):
                result = await attacker.call_tool(tool, {})
                assert result.is_error
                assert "ended early" in text_of(result), text_of(result)
        assert gw.gateway.pool.get("cutting").state is UpstreamState.UP
        done.set()
    assert failures == []  # before: "not connected (down: …)" while it reconnected


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
@pytest.mark.parametrize("client_mode", ["auto", "legacy"])
async def test_a_result_without_the_structured_content_its_schema_asks_is_that_calls_error(
    protocol: str, client_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the SDK client's RuntimeError crossed the gateway as a bug would: an ERROR
    # traceback, and the client a JSON-RPC error with code 0 or "Internal server error".
    async with (
        serving(cutting_upstream()) as base,
        running_gateway({"upstreams": {"cutting": {"url": f"{base}/mcp", "protocol": protocol}}}) as gw,
        Client(gw.url, mode=client_mode) as client,
    ):
        result = await client.call_tool("cutting__shapeless", {})
        assert result.is_error
        text = text_of(result)
        assert text.startswith("upstream 'cutting': tool 'shapeless': Tool shapeless has an output schema"), (
            text
        )
        assert not (await client.call_tool("cutting__echo", {"text": "hi"})).is_error
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
