"""An upstream whose subscriptions are watched: a handshake-era FastMCP server with a resource
per ``item://N`` that records each ``resources/subscribe`` and ``resources/unsubscribe`` it
answers, each after a pause of its own (a remote upstream's round trip)."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from fastmcp import FastMCP


def build(
    seen: list[tuple[str, str]],
    subscribe_delay: float = 0.0,
    unsubscribe_delay: float = 0.0,
    most: list[int] | None = None,
    release: anyio.Event | None = None,
) -> FastMCP:
    """The server; ``seen`` gets ``("subscribe" | "unsubscribe", uri)`` as each is answered,
    ``most[0]`` the most subscribes in flight at once. With ``release``, a subscribe is held
    until it is set (``subscribe_delay`` at most)."""
    server = FastMCP("watched")
    in_flight = 0

    @server.resource("item://{n}")
    def item(n: str) -> str:
        return n

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        nonlocal in_flight
        in_flight += 1
        if most is not None:
            most[0] = max(most[0], in_flight)
        try:
            with anyio.move_on_after(subscribe_delay):
                await (release.wait() if release is not None else anyio.sleep_forever())
        finally:
            in_flight -= 1
        seen.append(("subscribe", params.uri))
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        await anyio.sleep(unsubscribe_delay)
        seen.append(("unsubscribe", params.uri))
        return types.EmptyResult()

    lowlevel = server._mcp_server  # pyright: ignore[reportPrivateUsage]
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    return server
