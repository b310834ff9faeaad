"""An upstream's answer to a request, of the wrong shape for JSON-RPC (a ``result`` that is no
object, an ``error`` whose code is no integer), fails that request at once, saying so. Before,
over stdio, WebSocket and SSE, such a line was dropped as any that is not JSON-RPC: the call
waited its upstream's whole ``timeout`` (30 s by default) and failed as never answered
(-32001, ``no answer within 30s``), counted against the upstream's breaker as a timeout,
though the upstream had answered at once. A Streamable HTTP answer so made failed at once
already (the SDK answers a JSON body's request with its parse error)."""

from __future__ import annotations

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.faults.harness import BOUND, gateway_under_fault
from tests.servers.misshapen import SHAPES
from tests.support import python_upstream

TIMEOUT = 5.0
"""The upstream's timeout: the wrong-shaped answers' calls, run side by side, are refused
long before it (before, each failed at it)."""
SAID = "the upstream's answer is not a JSON-RPC response: its result or error has the wrong shape"


async def _asked(client: Client, method: str, shape: str) -> object:
    if method == "prompts/get":
        return await client.get_prompt(f"odd__{shape}", {})
    if method == "resources/read":
        return await client.read_resource(f"shape://{shape}")
    ref = types.PromptReference(type="ref/prompt", name="odd__null")
    return await client.complete(ref, {"name": "a", "value": shape})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_answer_of_the_wrong_shape_fails_its_request_at_once_and_others_are_served(
    mode: str,
) -> None:
    refusals: dict[tuple[str, str], MCPError] = {}
    upstream = python_upstream("misshapen.py", timeout=TIMEOUT)
    async with gateway_under_fault({"odd": upstream}) as faulted, Client(faulted.gw.url, mode=mode) as client:

        async def refused(method: str, shape: str) -> None:
            with pytest.raises(MCPError) as refusal:
                await _asked(client, method, shape)
            refusals[(method, shape)] = refusal.value

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                for method in ("prompts/get", "resources/read", "completion/complete"):
                    for shape in SHAPES:
                        tg.start_soon(refused, method, shape)
        odd = faulted.gw.gateway.pool.get("odd")
        assert (odd.connections, odd.state) == (1, "up")  # its session goes on
    assert len(refusals) == 3 * len(SHAPES)
    for (method, shape), error in refusals.items():
        # Before: -32001, "no answer within 5s".
        assert (error.error.code, SAID in error.error.message) == (types.INTERNAL_ERROR, True), (
            method,
            shape,
        )
