"""server-everything as a Streamable HTTP upstream (its own node process on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import mcp_types as types
import pytest
import pytest_asyncio

from tests.e2e.peers import (
    BOUND,
    MODES,
    connected,
    everything_on_a_port,
    hold,
    text_of,
)
from tests.support import RunningGateway, running_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

LISTENING = "listening on port"


@dataclass(frozen=True)
class HttpUpstream:
    url: str
    """server-everything's MCP endpoint (its transport serves POST/GET/DELETE on /mcp)."""
    port: int


@dataclass(frozen=True)
class Deployment:
    gateway: RunningGateway
    upstream: HttpUpstream


@asynccontextmanager
async def everything_over_http() -> AsyncIterator[HttpUpstream]:
    """server-everything's streamableHttp transport on a free loopback port; killed on exit."""
    async with everything_on_a_port("streamableHttp", LISTENING) as port:
        await _accepts(port)
        yield HttpUpstream(f"http://127.0.0.1:{port}/mcp", port)


async def _accepts(port: int) -> None:
    # The "listening" line is printed from the listen callback: the port accepts by now.
    with anyio.fail_after(BOUND):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await stream.aclose()


@asynccontextmanager
async def deployed() -> AsyncIterator[Deployment]:
    async with everything_over_http() as upstream:
        config = {"upstreams": {"everything": {"url": upstream.url}}}
        async with running_gateway(config) as gateway:
            assert gateway.gateway.pool.ready, gateway.gateway.pool.statuses()
            yield Deployment(gateway, upstream)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def deployment() -> AsyncIterator[Deployment]:
    value, stop = await hold(deployed())
    try:
        yield value
    finally:
        await stop()


async def test_the_gateway_holds_one_live_streamable_http_connection_to_the_upstream(
    deployment: Deployment,
) -> None:
    [status] = deployment.gateway.gateway.pool.statuses()
    assert (status.name, status.transport, str(status.state)) == ("everything", "streamable-http", "up")
    tools = deployment.gateway.gateway.catalog.snapshot.tools
    assert {"everything__echo", "everything__get-sum"} <= set(tools)


@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_call_through_the_gateway_reaches_the_http_upstream(
    deployment: Deployment, mode: str
) -> None:
    async with connected(deployment.gateway.url, mode) as client:
        total = await client.call_tool("everything__get-sum", {"a": 40, "b": 2})
        echo = await client.call_tool("everything__echo", {"message": f"over http, {mode}"})
    assert text_of(total) == "The sum of 40 and 2 is 42."
    assert text_of(echo) == f"Echo: over http, {mode}"


@pytest.mark.parametrize("mode", MODES)
async def test_structured_content_and_templates_work_through_the_http_upstream(
    deployment: Deployment, mode: str
) -> None:
    async with connected(deployment.gateway.url, mode) as client:
        weather = await client.call_tool("everything__get-structured-content", {"location": "New York"})
        resource = await client.read_resource("demo://resource/dynamic/text/3")
    assert weather.structured_content == {"temperature": 33, "conditions": "Cloudy", "humidity": 82}
    [content] = resource.contents
    assert isinstance(content, types.TextResourceContents)
    assert content.text.startswith("Resource 3: This is a plaintext resource")
