"""Every method answers a gateway error with the same JSON-RPC code, in both eras (issue 18).

The upstream is a real FastMCP server whose tool, prompt, resource, template and completion
each wait longer than the gateway's timeout, or fail on purpose; the client is the official
one. A timeout is -32001 (``UpstreamTimeout``) whichever method met it, an upstream's own
JSON-RPC error keeps its code, and a name the catalog does not hold is -32602.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support import RunningGateway, running_gateway, serving_upstream

MODES = ["legacy", "auto"]
SLOW = 30.0
TIMEOUT = 0.4
TEAPOT = -32010
"""An upstream's own error code, which the gateway passes on unchanged."""


def slow_upstream() -> FastMCP:
    server = FastMCP("slow")

    @server.tool
    async def wait() -> str:
        await anyio.sleep(SLOW)
        return "late"

    @server.prompt
    async def brief(topic: str) -> str:
        if topic == "refuse":
            raise MCPError(code=TEAPOT, message="the upstream refuses this topic")
        await anyio.sleep(SLOW)
        return topic

    @server.resource("note://slow")
    async def note() -> str:
        await anyio.sleep(SLOW)
        return "late"

    @server.resource("note://refused")
    async def refused_note() -> str:
        raise MCPError(code=TEAPOT, message="the upstream refuses this note")

    @server.resource("page://{n}")
    async def page(n: str) -> str:
        await anyio.sleep(SLOW)
        return n

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> list[str]:
        await anyio.sleep(SLOW)
        return []

    return server


@asynccontextmanager
async def gateway_and_client(mode: str) -> AsyncIterator[tuple[RunningGateway, Client]]:
    async with serving_upstream(slow_upstream()) as url:
        # No breaker: every method here must meet the timeout itself, not an open circuit.
        config = {"upstreams": {"slow": {"url": url, "timeout": TIMEOUT, "breaker": None}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            yield gw, client


async def code_of(request: Awaitable[Any]) -> int:
    with pytest.raises(MCPError) as raised, anyio.fail_after(SLOW / 3):
        await request
    return raised.value.error.code


def _methods(client: Client) -> dict[str, Callable[[], Awaitable[Any]]]:
    prompt = types.PromptReference(type="ref/prompt", name="slow__brief")
    return {
        "prompts/get": lambda: client.get_prompt("slow__brief", {"topic": "x"}),
        "resources/read": lambda: client.read_resource("note://slow"),
        "resources/read (template)": lambda: client.read_resource("page://1"),
        "completion/complete": lambda: client.complete(prompt, {"name": "topic", "value": "a"}),
    }


@pytest.mark.parametrize("mode", MODES)
async def test_an_upstream_timeout_is_32001_for_every_method(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway_and_client(mode) as (_, client):
        codes = {method: await code_of(call()) for method, call in _methods(client).items()}
        result = await client.call_tool("slow__wait", {})
    assert codes == dict.fromkeys(codes, types.REQUEST_TIMEOUT)
    # A tool's failure is a result the model can read, not a protocol error.
    assert result.is_error
    assert "no answer within 0.4s" in str(result.content[0])
    tracebacks = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert tracebacks == []  # an upstream's timeout is expected, not a gateway fault


@pytest.mark.parametrize("mode", MODES)
async def test_an_upstreams_own_error_code_passes_through(mode: str) -> None:
    upstream = slow_upstream()
    async with serving_upstream(upstream) as url:
        async with Client(url, mode=mode) as direct:  # type: ignore[arg-type]
            expected = (
                await code_of(direct.get_prompt("brief", {"topic": "refuse"})),
                await code_of(direct.read_resource("note://refused")),
            )
        config = {"upstreams": {"slow": {"url": url, "breaker": None}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            through = (
                await code_of(client.get_prompt("slow__brief", {"topic": "refuse"})),
                await code_of(client.read_resource("note://refused")),
            )
    assert through == expected
    assert expected[1] == TEAPOT


@pytest.mark.parametrize("mode", MODES)
async def test_a_name_nobody_serves_is_32602(mode: str) -> None:
    async with gateway_and_client(mode) as (_, client):
        prompt = await code_of(client.get_prompt("slow__nothing", {}))
        missing = types.PromptReference(type="ref/prompt", name="slow__nothing")
        completion = await code_of(client.complete(missing, {"name": "topic", "value": "a"}))
    assert (prompt, completion) == (types.INVALID_PARAMS, types.INVALID_PARAMS)


@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_resource_is_named_clipped_in_the_message_and_whole_in_data(mode: str) -> None:
    uri = "note://" + "u" * 5000
    async with gateway_and_client(mode) as (_, client):
        with pytest.raises(MCPError) as raised:
            await client.read_resource(uri)
    error = raised.value.error
    assert error.code == types.INVALID_PARAMS
    assert error.message == f"Resource not found: {uri[:80]!r}... (5007 characters)"
    assert error.data == {"uri": uri}  # SEP-2164: the URI itself, for the client to match
