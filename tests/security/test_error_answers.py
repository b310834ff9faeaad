"""A client's error answer to a question an upstream asked (sampling, here) reaches that
upstream cut short: a client answered with a 1 MB message, and the upstream, shared by every
client, spent its CPU logging it until its health check failed for all of them."""

from __future__ import annotations

import warnings
from typing import Any

import mcp_types as types
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent_gateway.errors import MAX_ERROR_CHARS
from tests.support import running_gateway, serving_upstream

LONG = 100_000


def asking_server() -> FastMCP:
    server = FastMCP("asker")

    @server.tool
    async def ask(ctx: Context) -> dict[str, Any]:
        """Ask the client's model; say what its error was, as this upstream got it."""
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hello?"))
        try:
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                await ctx.session.create_message(
                    messages=[message], max_tokens=5, related_request_id=ctx.request_id
                )
        except MCPError as exc:
            return {
                "message": len(exc.error.message),
                "data": exc.error.data is not None,
                "code": exc.error.code,
            }
        return {"message": 0, "data": False, "code": 0}

    return server


async def refusing(context: Any, params: types.CreateMessageRequestParams) -> types.ErrorData:
    return types.ErrorData(code=-32001, message="no" * (LONG // 2), data={"why": "x" * LONG})


async def test_a_clients_long_error_answer_reaches_the_upstream_cut() -> None:
    # Handshake-era clients only: a modern client answers an upstream's questions as input
    # responses, which hold results, not errors.
    async with (
        serving_upstream(asking_server()) as url,
        running_gateway({"upstreams": {"asker": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy", sampling_callback=refusing) as client,  # pyright: ignore[reportArgumentType]
    ):
        result = await client.call_tool("asker__ask", {})
    heard = result.structured_content
    assert heard is not None, result
    assert heard["code"] == -32001  # the client's own code
    assert MAX_ERROR_CHARS < heard["message"] < 2 * MAX_ERROR_CHARS  # cut, saying how long it was
    assert heard["data"] is False  # too long to pass: dropped
