"""The recorder (stdio), and tools that log or ask only after a delay: what an upstream sends
while a later request of the same client is in flight, outside either call's channel."""

from __future__ import annotations

from typing import Any

import anyio
import recorder

server = recorder.build(lambda _: None)


@server.tool(
    "later_say",
    "Sleep ``delay``, then log ``text`` at info.",
    {"delay": {"type": "number"}, "text": {"type": "string"}},
)
async def _later_say(ctx: recorder.Context, arguments: dict[str, Any]) -> str:
    await anyio.sleep(float(arguments["delay"]))
    await recorder.log(ctx, str(arguments["text"]), "info")
    return str(arguments["text"])


@server.tool("later_ask", "Sleep ``delay``, then ask the client for a name.", {"delay": {"type": "number"}})
async def _later_ask(ctx: recorder.Context, arguments: dict[str, Any]) -> str:
    await anyio.sleep(float(arguments["delay"]))
    return recorder.answered(await recorder.elicit_text(ctx, "name?"))


if __name__ == "__main__":
    recorder.main(server)
