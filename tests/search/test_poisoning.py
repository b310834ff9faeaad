"""An upstream whose tool descriptions are stuffed with the words users ask with, against
tool search through a running gateway: the request's own tool still comes first, and an
upstream weighted down (``search_weight``) gives up its places."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from fastmcp import FastMCP
from mcp import Client

from agent_gateway.search.tools import SEARCH_TOOLS
from tests.support import RunningGateway, running_gateway, serving_upstream
from tests.test_search_mode import found, text_of

REQUEST = "open a new ticket"


def filler(count: int) -> list[str]:
    """``count`` distinct made-up words (none a word of the request, none a stop word)."""
    syllables = ["ka", "lo", "mi", "ru", "te", "zo", "vi", "pa", "ne", "qu"]
    return ["".join(s) for s in itertools.islice(itertools.product(syllables, repeat=3), count)]


def tracker_server() -> FastMCP:
    """An issue tracker, its instructions of a real server's length (they are indexed with
    each of its tools, as the benchmark's real servers' are)."""
    server = FastMCP("tracker", instructions=" ".join(filler(180)[100:]))
    server.tool(lambda: "created", name="create_issue", description="Create a new issue in a project.")
    server.tool(lambda: "closed", name="close_issue", description="Close an issue.")
    server.tool(lambda: "listed", name="list_projects", description="List the projects.")
    for n, word in enumerate(filler(40)):  # enough tools that a word in a few of them is rare
        server.tool(lambda: "ok", name=f"{word}_{n}", description=f"Manage the {word} of a project.")
    return server


def stuffed_server(words: int, repeats: int = 3) -> FastMCP:
    """Two tools of no use whose descriptions hold the request's words ``repeats`` times among
    ``words`` others."""
    server = FastMCP("stuffed")
    description = " ".join(["open new ticket create issue"] * repeats + filler(words))
    for n in range(2):
        server.tool(lambda: "stuffed", name=f"helper_{n}", description=description)
    return server


@asynccontextmanager
async def two_upstreams(words: int, repeats: int = 3, **stuffed: Any) -> AsyncIterator[RunningGateway]:
    async with (
        serving_upstream(tracker_server()) as tracker,
        serving_upstream(stuffed_server(words, repeats)) as other,
    ):
        config = {
            "upstreams": {"tracker": {"url": tracker}, "stuffed": {"url": other} | stuffed},
            "search": {"mode": "on"},
        }
        async with running_gateway(config) as gw:
            yield gw


async def test_a_description_holding_every_word_does_not_outrank_the_tool_a_request_is_for() -> None:
    # Matching every word of every request, such a tool came first for all of them: five of
    # them took the top 5 of half the benchmark's requests (bench/README.md, "A stuffed upstream").
    # Its 800 other words (twice search.index.BROAD) halve its matches; the request's words
    # eight times over would put it first without that (said three times, its length alone
    # kept it second: the test passed with the scaling taken out).
    async with two_upstreams(800, repeats=8) as gw, Client(gw.url) as client:
        result = await client.call_tool(SEARCH_TOOLS, {"query": REQUEST, "limit": 3})
    assert found(result)[0] == "tracker__create_issue", text_of(result)


async def test_an_upstream_weighted_zero_is_never_found_and_its_tools_are_still_called() -> None:
    # A description of a real one's size (100 words) holding the request's words is found
    # first; an operator who does not trust the upstream's descriptions weighs it down.
    async with two_upstreams(100) as gw, Client(gw.url) as client:
        trusted = found(await client.call_tool(SEARCH_TOOLS, {"query": REQUEST}))
    async with two_upstreams(100, search_weight=0.25) as gw, Client(gw.url) as client:
        quartered = found(await client.call_tool(SEARCH_TOOLS, {"query": REQUEST}))
    async with two_upstreams(100, search_weight=0) as gw, Client(gw.url) as client:
        unfound = found(await client.call_tool(SEARCH_TOOLS, {"query": REQUEST}))
        named = found(await client.call_tool(SEARCH_TOOLS, {"query": "helper", "upstream": "stuffed"}))
        called = await client.call_tool("stuffed__helper_0", {})
    assert trusted[0].startswith("stuffed__"), trusted
    assert quartered[0] == "tracker__create_issue", quartered
    assert any(name.startswith("stuffed__") for name in quartered), quartered  # lower, not gone
    assert unfound[0] == "tracker__create_issue", unfound
    assert not any(name.startswith("stuffed__") for name in unfound), unfound
    assert named == []
    assert isinstance(called.content[0], types.TextContent)
    assert called.content[0].text == "stuffed"
