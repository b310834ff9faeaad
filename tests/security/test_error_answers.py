"""A client's error answer to a question an upstream asked (sampling, here) reaches that
upstream cut short: a client answered with a 1 MB message, and the upstream, shared by every
client, spent its CPU logging it until its health check failed for all of them. So does its
error answer to an agent run's question (an approval) reach the run's model."""

from __future__ import annotations

import json
import warnings
from typing import Any

import mcp_types as types
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent_gateway.errors import MAX_ERROR_CHARS
from tests.agent.model_apis import Turn, openai_api
from tests.agent.test_ask_agent import ask, text
from tests.agent.test_models import gateway_with_model, openai_model
from tests.support import running_gateway, serving, serving_upstream

LONG = 100_000
HUGE = 1_000_000


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


async def erring(context: Any, params: types.ElicitRequestParams) -> types.ErrorData:
    return types.ErrorData(code=-32001, message="Z" * HUGE, data={"why": "x" * LONG})


async def test_a_clients_long_error_answer_to_an_approval_reaches_the_model_cut() -> None:
    # Before, the 1 MB message went whole into the tool's result: to the model provider (a
    # 1 MB request) and into the conversation the run keeps.
    app, api = openai_api([Turn(calls=[("math__drop_table", {"table": "users"})]), Turn(text="Not run.")])
    async with (
        serving(app) as base,
        gateway_with_model(openai_model(base)) as (gw, math),
        Client(gw.url, mode="legacy", elicitation_callback=erring) as client,  # pyright: ignore[reportArgumentType]
    ):
        result = await ask(client, "Drop the users table.")
    assert not result.is_error, text(result)
    assert math.calls == []
    told = [m["content"] for m in api.requests[1]["messages"] if m["role"] == "tool"]
    assert len(told) == 1
    assert told[0].count("Z") == MAX_ERROR_CHARS  # the client's own words, cut
    assert f"({HUGE} characters)" in told[0]  # saying how long it was
    assert len(json.dumps(api.requests[1])) < 4 * MAX_ERROR_CHARS + len(json.dumps(api.requests[0]))
