"""An upstream that answers a call with noise (what makes no message: comments, blank lines,
lines that do not parse) costs the gateway only that call, briefly, on every transport: the
call fails saying why, a bystander calling another upstream is served throughout, and the
upstream's connection is let go as for any broken upstream. Last round bounded the modern
era's answer stream (``test_stream_noise.py``); these are the other transports."""

from __future__ import annotations

import anyio
from fastmcp import FastMCP
from mcp import Client

from tests.faults.harness import gateway_under_fault, text_of, wait_until
from tests.faults.test_stream_noise import FLOOD, WAIT, dripping, kit
from tests.support import serving

SSE = [(b"content-type", b"text/event-stream")]
CHUNK = b":\n" * 32768


def drip_kit() -> FastMCP:
    server = kit()

    @server.tool
    async def drip() -> str:
        """Never answers (its noise is written by the layer in front)."""
        await anyio.sleep_forever()
        return "never"

    return server


async def test_a_handshake_era_calls_answer_stream_of_comments_fails_the_call_and_a_bystander_is_served() -> (
    None
):
    # The SDK's transport read the POST's answer stream through httpx2's EventSource, under no
    # noise bound: comments without end were parsed until the call's timeout (60 s here), the
    # gateway's CPU spent all along.
    sent = list[int]()
    async with serving(dripping(drip_kit(), sent)) as base:
        upstream = {"url": f"{base}/mcp", "protocol": "legacy", "timeout": 60}
        async with gateway_under_fault({"up": upstream}) as faulted, Client(faulted.gw.url) as client:
            with anyio.fail_after(WAIT):
                dripped = await client.call_tool("up__drip", {})
            assert dripped.is_error
            assert "made no message" in text_of(dripped), text_of(dripped)
            assert text_of(await client.call_tool("up__ping", {})) == "pong"
            await wait_until(lambda: bool(sent), WAIT)  # the upstream's writes end once let go
    assert sent[0] < FLOOD // 4, sent  # let go (the socket buffers hold a few MiB more), not read on
