"""An error code past what clients read (JSON-RPC allows any integer; clients read it into a
32-bit field or a JavaScript number) is passed on as -32603, saying so, in both directions:
an upstream's error to a client, and a client's error answer to an upstream's question.
Before, an upstream's code of 10**30 reached the client as it was, and a client whose parser
reads 32 bits lost the whole answer."""

from __future__ import annotations

import warnings
from typing import Any

import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.faults.harness import gateway_under_fault, text_of
from tests.support import python_upstream, serving_upstream

PAST = "past what clients read"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstreams_error_code_past_32_bits_reaches_the_client_as_internal_error(mode: str) -> None:
    upstream = python_upstream("misshapen.py")
    async with gateway_under_fault({"odd": upstream}) as faulted, Client(faulted.gw.url, mode=mode) as client:
        with pytest.raises(MCPError) as wide:
            await client.get_prompt("odd__bigcode", {})
        with pytest.raises(MCPError) as own:
            await client.get_prompt("odd__owncode", {})
    assert wide.value.error.code == types.INTERNAL_ERROR
    assert "failed" in wide.value.error.message
    assert f"31 digits, is {PAST}" in wide.value.error.message
    assert own.value.error.code == -32099  # within the range: passed as the upstream sent it
    assert PAST not in own.value.error.message


async def _refused(context: Any, params: types.CreateMessageRequestParams) -> types.ErrorData:
    return types.ErrorData(code=10**30, message="no model here")


def _asking() -> FastMCP:
    """An upstream whose ``ask`` asks the client's model and says the error code it got."""
    server = FastMCP("asking")

    @server.tool
    async def ask(ctx: Context) -> str:
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))
        try:
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                await ctx.session.create_message(
                    messages=[message], max_tokens=5, related_request_id=ctx.request_id
                )
        except MCPError as refused:
            return f"{refused.error.code}: {refused.error.message}"
        return "answered"

    return server


async def test_a_clients_error_code_past_32_bits_reaches_the_upstream_as_internal_error() -> None:
    async with (
        serving_upstream(_asking()) as url,
        gateway_under_fault({"up": {"url": url, "protocol": "legacy"}}) as faulted,
        Client(faulted.gw.url, mode="legacy", sampling_callback=_refused) as client,
    ):
        said = text_of(await client.call_tool("up__ask", {}))
    assert said.startswith(f"{types.INTERNAL_ERROR}: no model here")
    assert PAST in said
