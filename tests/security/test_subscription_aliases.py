"""A session subscribed to a URI and to its alias (``item://0``, ``w+item://0``) holds two
subscriptions of one upstream's: each counts against its ``max_subscriptions``, as a listen
stream naming both counts two; and a subscribe its upstream refuses keeps nothing (a
recording upstream behind a real gateway, the official client downstream)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.security.test_subscriptions import _subscribed, _wait, watched_gateway
from tests.support import running_gateway, serving_upstream

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")


async def test_a_uri_and_its_alias_are_two_subscriptions_against_the_bound() -> None:
    # Before, the bound counted upstream URIs, not the names held: a session allowed one
    # held item://0 and w+item://0 (two, as its count said), and with a few names per
    # upstream URI went past max_subscriptions, which a listen stream naming both may not.
    seen: list[tuple[str, str]] = []
    async with watched_gateway(seen, {"max_subscriptions": 1}) as gw:
        async with Client(gw.url, mode="legacy") as client:
            await client.subscribe_resource("item://0")
            await client.subscribe_resource("item://0")  # held already: not one more
            refused = await _refusal(client.subscribe_resource("w+item://0"))
            held = gw.gateway.subscriptions.count
        async with Client(gw.url) as client:
            with pytest.raises(MCPError) as streamed:
                async with client.listen(resource_subscriptions=["item://0", "w+item://0"]):
                    pass
        assert "2 resource subscriptions in one listen stream" in streamed.value.error.message
        await _wait(lambda: _subscribed(seen) == set())
    assert refused == (
        "client limit: 2 resource subscriptions in one session; the limit (max_subscriptions) is 1"
    )
    assert held == 1


async def _refusal(request: Awaitable[Any]) -> str:
    """The error ``request`` was refused with ("": it was not)."""
    try:
        await request
    except MCPError as exc:
        return exc.error.message
    return ""


async def test_subscribes_the_upstream_refuses_leave_no_lock_behind() -> None:
    # Before, each subscribe the upstream refused (one that serves none) kept its key's lock
    # for good: a client asking for note://0, note://1... grew the gateway without bound.
    server = FastMCP("plain")

    @server.resource("note://{n}")
    def note(n: str) -> str:
        return n

    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"p": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        refusals = [await _refusal(client.subscribe_resource(f"note://{n}")) for n in range(20)]
        locks = len(gw.gateway.subscriptions._locks)  # pyright: ignore[reportPrivateUsage]
    assert all(refusals)
    assert locks == 0
