"""server-everything as a legacy SSE upstream (its own node process on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.e2e.peers import (
    MODES,
    connected,
    everything_on_a_port,
    text_of,
)
from tests.support import running_gateway

pytestmark = pytest.mark.e2e

READY = "Server is running on port"
"""What server-everything's SSE transport prints (to stderr) from its listen callback."""


@asynccontextmanager
async def everything_over_sse() -> AsyncIterator[str]:
    """server-everything's SSE transport on a free loopback port; yield its /sse URL."""
    async with everything_on_a_port("sse", READY) as port:
        yield f"http://127.0.0.1:{port}/sse"


async def test_the_echo_tool_of_an_sse_upstream_answers_through_the_gateway() -> None:
    async with everything_over_sse() as url:
        config = {"upstreams": {"everything": {"url": url, "transport": "sse"}}}
        async with running_gateway(config) as gw:
            [status] = gw.gateway.pool.statuses()
            assert (status.transport, str(status.state)) == ("sse", "up"), status
            for mode in MODES:
                async with connected(gw.url, mode) as client:
                    echo = await client.call_tool("everything__echo", {"message": f"over sse, {mode}"})
                assert text_of(echo) == f"Echo: over sse, {mode}"
