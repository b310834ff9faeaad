"""What a start and an IDE's connection log: nothing an operator must act on, when nothing is wrong."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.e2e.peers import BOUND
from tests.support import npm_server, running_gateway, serving_upstream

pytestmark = pytest.mark.e2e


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]


async def set_level(client: Client, level: types.LoggingLevel) -> None:
    request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))
    await client.session.send_request(request, types.EmptyResult)


async def test_an_upstream_asking_for_roots_with_no_client_to_ask_gets_none_quietly(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """server-everything asks for roots as soon as it is connected, before any client call."""
    caplog.set_level(logging.DEBUG, logger="agent_gateway")
    async with running_gateway({"upstreams": {"everything": npm_server("server-everything", "stdio")}}):
        with anyio.fail_after(BOUND):
            while "roots/list from everything" not in caplog.text:
                await anyio.sleep(0.02)
    asked = [r for r in caplog.records if "roots/list from everything" in r.getMessage()]
    assert [r.levelno for r in asked] == [logging.DEBUG]
    assert warnings_in(caplog) == []
    assert "Failed to request roots" not in capfd.readouterr().err  # the upstream took the answer


async def test_an_upstream_without_logging_never_gets_set_level_and_nothing_is_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """server-memory declares no logging capability (the Inspector sets a level on connect)."""
    async with running_gateway({"upstreams": {"memory": npm_server("server-memory")}}) as gw:
        for _ in range(2):
            async with Client(gw.url, mode="legacy") as client:
                await set_level(client, "debug")
                await client.call_tool("memory__read_graph", {})
    assert warnings_in(caplog) == []


class _NoSetLevel(Middleware):
    """An upstream that declares logging but answers logging/setLevel with Method not found."""

    def __init__(self, asked: list[str]) -> None:
        self._asked = asked

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method == "logging/setLevel":
            self._asked.append(str(context.method))
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found")
        return await call_next(context)


async def test_a_set_level_the_upstream_does_not_implement_is_sent_once_and_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked: list[str] = []
    server = FastMCP("terse")
    server.add_middleware(_NoSetLevel(asked))

    @server.tool
    def ping() -> str:
        """Answer at once."""
        return "pong"

    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"terse": {"url": url, "protocol": "legacy"}}}) as gw,
    ):
        for level in ("debug", "info", "warning"):
            async with Client(gw.url, mode="legacy") as client:
                await set_level(client, level)  # type: ignore[arg-type]
                await client.call_tool("terse__ping", {})
    assert asked == ["logging/setLevel"]
    assert warnings_in(caplog) == []
