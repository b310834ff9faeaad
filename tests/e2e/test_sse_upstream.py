"""server-everything as a legacy SSE upstream (its own node process on loopback)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from tests.e2e.peers import (
    BOUND,
    EVERYTHING,
    FORCE_LOOPBACK,
    MODES,
    collect_output,
    connected,
    stop_process,
    text_of,
)
from tests.support import free_socket, running_gateway

pytestmark = pytest.mark.e2e

READY = "Server is running on port"
"""What server-everything's SSE transport prints (to stderr) from its listen callback."""


@asynccontextmanager
async def everything_over_sse() -> AsyncIterator[str]:
    """server-everything's SSE transport on a free loopback port; yield its /sse URL."""
    with free_socket() as sock:
        port = sock.getsockname()[1]
    command = ["node", "--require", str(FORCE_LOOPBACK), str(EVERYTHING / "index.js"), "sse"]
    process = await anyio.open_process(
        command, env={**os.environ, "PORT": str(port)}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    lines: list[str] = []
    ready = anyio.Event()
    try:
        assert process.stderr is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect_output, process.stderr, lines, ready, READY)
            with anyio.fail_after(BOUND):
                await ready.wait()
            assert any(READY in line for line in lines), f"server-everything did not start: {lines}"
            yield f"http://127.0.0.1:{port}/sse"
            tg.cancel_scope.cancel()
    finally:
        await stop_process(process)


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
