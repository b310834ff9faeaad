"""The search engine kept in step with the catalog from start-up on."""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext

import anyio
import mcp_types as types
import pytest

from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.catalog_parts import Listing
from agent_gateway.config_files import parse_config
from agent_gateway.search.engine import ToolSearch
from agent_gateway.search.engine import _fused as fused  # pyright: ignore[reportPrivateUsage]

BOUND = 10.0


def listing(*names: str) -> Listing:
    return Listing(
        tools=tuple(
            types.Tool(name=n, description=f"{n.replace('_', ' ')} tool", input_schema={"type": "object"})
            for n in names
        )
    )


@pytest.mark.parametrize("running", [False, True], ids=["here", "worker-thread"])
async def test_parts_indexed_while_others_connect_end_as_the_first_snapshot_says(
    caplog: pytest.LogCaptureFixture, running: bool
) -> None:
    config = parse_config(
        {"upstreams": {n: {"url": "http://127.0.0.1:9/mcp"} for n in ("tracker", "chat", "mail")}},
        {},
        source="test",
    )
    catalog, search = Catalog(config), ToolSearch()
    catalog.subscribe_early(search.prepare)
    async with search.running() if running else nullcontext():
        await catalog.update("tracker", listing("create_issue", "close_issue"))
        await catalog.update("chat", listing("post_message"))
        await catalog.update("mail", listing("send_email"))
        await catalog.update("tracker", listing("create_ticket"))  # listed again before start-up
        await catalog.withdraw("mail")  # down again before start-up
        if not running:  # indexed already, before the first snapshot lists anything
            assert (await search.search(catalog.snapshot, "post message", 10))[1] >= 1
        snapshot = catalog.start()
        with caplog.at_level(logging.INFO, logger="agent_gateway.search.engine"):
            await search.load(snapshot)  # running: once the worker thread has indexed each part
        assert "(2 indexed as they connected)" in caplog.text
        await _searches_match(search, snapshot)


async def _searches_match(search: ToolSearch, snapshot: CatalogSnapshot) -> None:
    async def names(query: str) -> list[str]:
        found, _ = await search.search(snapshot, query, 10)
        return [f.tool.name for f in found]

    assert await names("create ticket") == ["tracker__create_ticket"]
    assert "tracker__close_issue" not in await names("close issue")
    found, total = await search.search(snapshot, "send email", 10)
    assert "mail__send_email" not in [f.tool.name for f in found]
    assert total == len(found)  # no row of the withdrawn upstream left in the index
    assert await names("post message") == ["chat__post_message"]


async def test_a_change_while_the_start_up_index_is_built_is_not_undone_by_it() -> None:
    # The catalog is live once started, while load() still waits for the worker thread: an
    # upstream listing again then must win over its older part still queued for the thread.
    names = [f"u{i}" for i in range(30)]
    config = parse_config(
        {"upstreams": {n: {"url": "http://127.0.0.1:9/mcp"} for n in names}}, {}, source="t"
    )
    catalog, search = Catalog(config), ToolSearch()
    catalog.subscribe_early(search.prepare)
    catalog.subscribe(search.changed)
    async with search.running():
        for name in names:  # ~9,000 tools: the thread is still at them when the change comes
            await catalog.update(name, listing(*(f"{name}_tool_{i}" for i in range(300))))
        snapshot = catalog.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(search.load, snapshot)
            await catalog.update("u29", listing("renamed_tool"))
        found, _ = await search.search(catalog.snapshot, "renamed", 10)
        assert [f.tool.name for f in found] == ["u29__renamed_tool"]
        found, _ = await search.search(catalog.snapshot, "u29_tool_7", 10)
        assert "u29__u29_tool_7" not in [f.tool.name for f in found]


async def test_the_start_up_indexing_waits_again_when_running_again(caplog: pytest.LogCaptureFixture) -> None:
    # The second start-up lists 2,000 tools: a load that returned before the worker thread had
    # indexed them would count the first start-up's one (its log line says how many it holds
    # as it returns), however soon the thread caught up for the search after it.
    config = parse_config({"upstreams": {"tracker": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="t")
    search = ToolSearch()
    for tools in (["create_issue"], [f"close_issue_{n}" for n in range(2000)]):
        catalog = Catalog(config)
        catalog.subscribe_early(search.prepare)
        async with search.running():
            await catalog.update("tracker", listing(*tools))
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="agent_gateway.search.engine"):
                await search.load(catalog.start())
            said = f"{len(tools)} tool{'s' if len(tools) > 1 else ''} from 1 upstream ("
            assert f"tool index ready: {said}" in caplog.text, caplog.text
            found, _ = await search.search(catalog.snapshot, tools[-1], 10)
            assert [f.tool.name for f in found][:1] == [f"tracker__{tools[-1]}"]


async def test_among_a_few_candidates_a_hairs_difference_in_meaning_does_not_outweigh_the_words() -> None:
    # Two tools (one upstream's, or a narrow policy's): the words prefer the first by far,
    # the meaning the second by a hair. Standardized over two values, any difference is a
    # whole deviation; the least spread keeps a hair a hair.
    config = parse_config({"upstreams": {"tracker": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="test")
    catalog = Catalog(config)
    await catalog.update("tracker", listing("create_issue", "close_issue"))
    snapshot = catalog.start()
    lexical = [("tracker__create_issue", "tracker", 0.9), ("tracker__close_issue", "tracker", 0.3)]
    for cosines in ((0.80001, 0.8), (0.9, 0.1)):
        hair = cosines == (0.80001, 0.8)
        dense = [("tracker__close_issue", cosines[0], 0.0), ("tracker__create_issue", cosines[1], 0.0)]
        order = [key for key, _, _ in fused(lexical, dense, snapshot)]
        assert order[0] == ("tracker__create_issue" if hair else "tracker__close_issue"), cosines


async def test_a_search_runs_off_the_event_loop_while_others_are_served() -> None:
    # A search of many common words at 10,000 tools takes a third of a second: other clients'
    # requests must not wait it out. The policy filter runs inside the search; here it waits
    # for a task of the event loop, which could never run if the search held the loop.
    config = parse_config({"upstreams": {"tracker": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="test")
    catalog, search = Catalog(config), ToolSearch()
    await catalog.update("tracker", listing("create_issue", "close_issue"))
    snapshot = catalog.start()
    await search.load(snapshot)
    entered, served = threading.Event(), threading.Event()
    waited: list[bool] = []

    def accept(name: str) -> bool:
        if not waited:
            entered.set()
            waited.append(served.wait(BOUND))
        return True

    async def bystander() -> None:  # served only once the search is under way, however it began
        with anyio.fail_after(BOUND):
            while not entered.is_set():
                await anyio.sleep(0.005)
        served.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(bystander)
        found, _ = await search.search(snapshot, "create issue", 10, accept=accept)
        assert found[0].tool.name == "tracker__create_issue"
    assert waited == [True]  # the bystander ran while the search was under way

    catalog.subscribe(search.changed)
    await catalog.update("tracker", listing("create_ticket"))  # re-indexed in the thread too
    found, _ = await search.search(catalog.snapshot, "create ticket", 10)
    assert [f.tool.name for f in found] == ["tracker__create_ticket"]


async def test_a_names_words_past_the_longest_name_mcp_allows_are_not_indexed() -> None:
    # The name is the heaviest field: a tool named with 3,000 words (no MCP name is longer
    # than 128 characters) was found first for any request holding one of them, above the
    # tools that do what it asks (helper AA: one such tool in the top 5 for 111 of 336 queries).
    config = parse_config(
        {"upstreams": {n: {"url": "http://127.0.0.1:9/mcp"} for n in ("weather", "stuffed")}},
        {},
        source="test",
    )
    catalog, search = Catalog(config), ToolSearch()
    catalog.subscribe_early(search.prepare)
    stuffed = "_".join(["lookup"] * 30 + ["forecast", "tomorrow", "rain"])
    weather = types.Tool(
        name="get_forecast", description="The forecast for a city: rain, sun, wind.", input_schema={}
    )
    await catalog.update("weather", Listing(tools=(weather,)))
    await catalog.update("stuffed", Listing(tools=(types.Tool(name=stuffed, input_schema={}),)))
    found, _ = await search.search(catalog.start(), "will it rain tomorrow", 10)
    assert [f.tool.name for f in found] == ["weather__get_forecast"]
