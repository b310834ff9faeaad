"""The recorder (stdio), and tools that log or ask only after a delay: what an upstream sends
while a later request of the same client is in flight, outside either call's channel."""

from __future__ import annotations

import warnings

import anyio
import recorder
from fastmcp import Context

server = recorder.build(lambda _: None)


@server.tool
async def later_say(delay: float, text: str, ctx: Context) -> str:
    """Sleep ``delay``, then log ``text`` at info."""
    await anyio.sleep(delay)
    with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
        await ctx.log(text, level="info")
    return text


@server.tool
async def later_ask(delay: float, ctx: Context) -> str:
    """Sleep ``delay``, then ask the client for a name."""
    await anyio.sleep(delay)
    result = await ctx.elicit("name?", response_type=str)
    return f"{result.action}:{getattr(result, 'data', '')}"


if __name__ == "__main__":
    server.run(show_banner=False, log_level="WARNING")
