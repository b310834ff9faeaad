"""An upstream's hostile listing costs only that upstream: a schema too deep for any client
to read, another upstream's resource URI, a template that matches every URI (a review's
findings; each upstream is ``tests/servers/hostile_listings.py``, raw JSON-RPC over stdio)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import mcp_types as types
from fastmcp import FastMCP
from mcp import Client
from pydantic import Field

from agent_gateway.catalog import Catalog
from agent_gateway.catalog_parts import MAX_INSTRUCTIONS, MAX_LISTED, Listing
from agent_gateway.compat.mcp import MAX_MESSAGE_VALUES
from agent_gateway.config_files import parse_config
from tests.faults.harness import gateway_under_fault, text_of, wait_until
from tests.support import SERVERS, python_upstream, running_gateway, serving_upstream


def hostile(mode: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVERS / "hostile_listings.py"), mode]}


async def test_a_tool_whose_schema_nests_too_deep_is_left_out_and_every_listing_stays_whole() -> None:
    # 150 levels of properties (301 of JSON objects): no tools/list page holding it could be
    # written (pydantic serialises 255), and the official client lists before it calls.
    config = {"upstreams": {"deep": hostile("deep150"), "healthy": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        counted = text_of(await client.call_tool("healthy__increment", {}))
    assert "deep__deep" not in names
    assert {"deep__collide", "healthy__increment"} <= set(names)
    assert counted == "1"


async def test_a_tool_whose_schema_is_larger_than_the_gateway_takes_is_left_out_alone() -> None:
    # Its schema was otherwise bounded only by the message size (128 MiB), and carried in
    # every client's listing page holding the tool.
    config = {"upstreams": {"huge": hostile("wide140000"), "fits": hostile("wide40000")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        names: list[str] = []
        cursor: str | None = None
        while True:  # a page ends before 128 KiB of definitions: the wide tool has one of its own
            page = await client.list_tools(cursor=cursor)
            names += [t.name for t in page.tools]
            if not (cursor := page.next_cursor):
                break
    assert "huge__wide" not in names  # ~1.3 MB
    assert {"huge__collide", "fits__wide", "fits__collide"} <= set(names)  # ~360 KB: listed


async def test_an_upstream_listing_more_schema_bytes_than_the_gateway_takes_is_refused_alone() -> None:
    # Each schema within its own bound (1 MiB), 10,000 of them would be 10 GiB: 400 of
    # ~200 KB (80 MB) pass the bound on one upstream's list of one kind (64 MiB).
    config = {"upstreams": {"fat": hostile("fat400"), "healthy": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        counted = text_of(await client.call_tool("healthy__increment", {}))
        refused = next(s for s in gw.gateway.pool.statuses() if s.name == "fat")
        catalog = gw.gateway.catalog.snapshot
    assert counted == "1"
    assert "fat__t0" not in catalog.tools
    assert "MiB of names, descriptions and schemas" in (refused.last_error or "")


async def test_a_deep_schema_a_client_can_read_is_listed() -> None:
    config = {"upstreams": {"deep": hostile("deep40")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert "deep__deep" in names


async def test_an_upstream_listing_a_uri_another_serves_gets_only_its_own_qualified_one() -> None:
    upstreams = {"good": hostile("good"), "evil": hostile("evil")}
    async with gateway_under_fault(upstreams) as faulted, Client(faulted.gw.url) as client:
        before = await client.read_resource("file:///shared/doc")
        assert text_of(await client.call_tool("evil__collide", {})) == "collide"
        snapshot = lambda: faulted.gw.gateway.catalog.snapshot  # noqa: E731
        await wait_until(lambda: "evil+file:///shared/doc" in snapshot().resources)
        after = await client.read_resource("file:///shared/doc")
        theirs = await client.read_resource("evil+file:///shared/doc")
    assert [r.contents[0].text for r in (before, after, theirs)] == ["good", "good", "evil"]  # type: ignore[union-attr]


async def test_a_catch_all_template_does_not_take_the_reads_of_a_more_specific_one() -> None:
    # The catch-all's upstream comes first in the configuration: order alone would send it
    # every read, and the URI with whatever it names.
    upstreams = {"evil": hostile("catchall"), "good": hostile("good")}
    async with gateway_under_fault(upstreams) as faulted, Client(faulted.gw.url) as client:
        logs = await client.read_resource("file:///logs/today")
        other = await client.read_resource("notes://anything")
    assert [r.contents[0].text for r in (logs, other)] == ["good", "catchall"]  # type: ignore[union-attr]


async def test_a_schema_deeper_than_the_encoder_goes_is_left_out_not_the_whole_listing() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(950):  # msgspec's encoder stops near 1,000 levels with a RecursionError
        schema = {"type": "object", "properties": {"a": schema}}
    config = parse_config({"upstreams": {"deep": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="test")
    catalog = Catalog(config)
    tools = (
        types.Tool(name="deep", input_schema=schema),
        types.Tool(name="flat", input_schema={"type": "object"}),
    )
    await catalog.update("deep", Listing(tools=tools))
    assert list(catalog.start().tools) == ["deep__flat"]


async def test_an_upstream_listing_more_tools_than_the_gateway_takes_is_refused_alone() -> None:
    # 60,000 tools of 2 KB each (120 MB) were read and kept whole; the largest real servers
    # list a few hundred. At the bound they are taken, one more and the upstream is refused.
    upstreams = {"many": hostile(f"many{MAX_LISTED + 1}"), "most": hostile(f"many{MAX_LISTED}")}
    config = {"upstreams": {**upstreams, "healthy": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        counted = text_of(await client.call_tool("healthy__increment", {}))
        catalog = gw.gateway.catalog.snapshot
        refused = next(s for s in gw.gateway.pool.statuses() if s.name == "many")
    assert counted == "1"
    assert "many__t0" not in catalog.tools
    assert {"most__t0", f"most__t{MAX_LISTED - 1}"} <= set(catalog.tools)
    assert refused.state != "up"  # down, and tried again after its backoff
    assert "more than the gateway takes from one upstream" in (refused.last_error or "")


async def test_a_page_of_more_items_than_the_gateway_takes_is_refused_before_they_are_read() -> None:
    # Counted after its items were made models: a page of a million tiny tools (50 MB) took
    # 20 s of the event loop and 2.8 GB, every retry. Its items are not even tools: refused
    # for their number, they were never validated.
    config = {
        "upstreams": {"junk": hostile(f"junk{MAX_LISTED + 1}"), "healthy": python_upstream("counter.py")}
    }
    async with running_gateway(config) as gw, Client(gw.url) as client:
        counted = text_of(await client.call_tool("healthy__increment", {}))
        refused = next(s for s in gw.gateway.pool.statuses() if s.name == "junk")
    assert counted == "1"
    assert refused.state != "up"
    assert "more than the gateway takes from one upstream" in (refused.last_error or "")


async def test_a_page_of_more_json_values_than_the_gateway_reads_is_refused_before_it_is_parsed() -> None:
    # Counted only once parsed, a page of a million tiny tools (56 MB) stalled every client
    # 3.2 s and took 1.8 GB at each retry; this page holds about 1.2 million values.
    junk = hostile(f"junk{MAX_MESSAGE_VALUES * 6 // 10}")
    config = {"upstreams": {"junk": junk, "healthy": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        counted = text_of(await client.call_tool("healthy__increment", {}))
        refused = next(s for s in gw.gateway.pool.statuses() if s.name == "junk")
    assert counted == "1"
    assert refused.state != "up"
    assert f"the gateway reads at most {MAX_MESSAGE_VALUES:,} from one message" in (refused.last_error or "")


async def test_an_upstreams_megabytes_of_instructions_are_cut_and_every_client_still_connects() -> None:
    """Two MiB of an upstream's instructions made every handshake-era client's ``initialize``
    answer larger than the official client reads (1 MiB): no client could connect at all."""
    wordy = FastMCP("wordy", instructions="Read this first. " + "x" * 2 * 2**20)
    wordy.tool(lambda: "said", name="say")
    async with (
        serving_upstream(wordy) as url,
        running_gateway(
            {"upstreams": {"wordy": {"url": url}, "healthy": python_upstream("counter.py")}}
        ) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        said = text_of(await client.call_tool("wordy__say", {}))
        counted = text_of(await client.call_tool("healthy__increment", {}))
        instructions = client.instructions or ""
    assert (said, counted) == ("said", "1")
    assert "[wordy] Read this first. xxx" in instructions
    assert f"... (cut: {len('Read this first. ') + 2 * 2**20} characters)\n\n[healthy]" in instructions
    assert len(instructions) < MAX_INSTRUCTIONS + 100


OVER_ITEM_BYTES = 2 * 2**20
"""Past what the gateway lists of one item besides a tool's schemas (1 MiB)."""


def oversized(size: int = OVER_ITEM_BYTES) -> FastMCP:
    """An upstream of one small item of each kind, and one of each holding ``size`` bytes
    besides any schema: a description, a prompt's argument's, a resource's ``_meta``."""
    server = FastMCP("oversized")
    server.tool(lambda: "ok", name="small")
    server.tool(lambda: "big", name="big", description="d" * size)
    server.prompt(lambda: "ok", name="small")

    @server.prompt(name="big")
    def big_prompt(text: Annotated[str, Field(description="a" * OVER_ITEM_BYTES)]) -> str:
        return text

    server.resource("file:///small", name="small")(lambda: "ok")
    server.resource("file:///big", name="big", meta={"m": "m" * size})(lambda: "big")
    server.resource("file:///t/{x}", name="t", description="t" * size)(lambda x: x)
    return server


async def test_an_item_holding_more_than_the_gateway_lists_is_left_out_alone() -> None:
    # Before, bounded only by the upstream's list (64 MiB) and message (128 MiB): every client's
    # listing page holding it carried it (a tool of a 60 MB description: 60 MB a tools/list).
    async with (
        serving_upstream(oversized()) as url,
        running_gateway({"upstreams": {"up": {"url": url}, "healthy": python_upstream("counter.py")}}) as gw,
        Client(gw.url) as client,
    ):
        tools = [t.name for t in (await client.list_tools()).tools]
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        resources = [str(r.uri) for r in (await client.list_resources()).resources]
        templates = (await client.list_resource_templates()).resource_templates
        small = await client.read_resource("file:///small")
        counted = text_of(await client.call_tool("healthy__increment", {}))
    assert "up__small" in tools
    assert "up__big" not in tools
    assert prompts == ["up__small"]
    assert resources == ["file:///small"]
    assert templates == []
    assert isinstance(small.contents[0], types.TextResourceContents)
    assert small.contents[0].text == "ok"
    assert counted == "1"


async def test_an_upstream_whose_list_loops_is_read_to_the_repeated_cursor_once() -> None:
    # Before, its pages were read 1,000 times at each listing (the bound on pages), every tool
    # 999 times skipped as a name already given, and its template, counted 1,000 times, was
    # qualified as if several upstreams listed it.
    config = {"upstreams": {"loop": hostile("loop"), "healthy": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        pages = text_of(await client.call_tool("loop__pages", {}))
        templates = (await client.list_resource_templates()).resource_templates
        counted = text_of(await client.call_tool("healthy__increment", {}))
    assert pages == "2"  # the first page, and the page its cursor names, read again
    assert [t.uri_template for t in templates] == ["file:///logs/{name}"]
    assert counted == "1"
    assert "loop__collide" in gw.gateway.catalog.snapshot.tools


async def test_an_upstream_refusing_its_handshake_at_length_is_said_down_in_bounded_words(
    tmp_path: Path,
) -> None:
    # Once up, it dies, and every restart's initialize is refused with 3 MB of message. Before,
    # that message was its last error whole: each call to its tools (still listed, as
    # failure_mode: fail_open keeps them) answered 3 MB, /status 3 MB, /readyz twice that.
    died = tmp_path / "died"
    relapsing = hostile("relapse") | {
        "env": {"RELAPSE_FILE": str(died), "RELAPSE_CHARS": "3000000"},
        "retry": {"initial_delay": 0.1, "max_delay": 60},  # back at once, then refused at length
    }
    config = {"upstreams": {"sick": relapsing, "healthy": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url) as client, httpx.AsyncClient() as http:
        assert (await client.call_tool("sick__die", {})).is_error
        sick = gw.gateway.pool.get("sick")
        await wait_until(lambda: (sick.last_error or "").startswith("no no"))
        answer = text_of(await client.call_tool("sick__collide", {}))
        status = (await http.get(f"{gw.base}/status")).text
        ready = (await http.get(f"{gw.base}/readyz")).text
        counted = text_of(await client.call_tool("healthy__increment", {}))
    assert answer.startswith("upstream 'sick': not connected (down: no no no")
    assert answer.endswith("… (3000000 characters))")
    assert len(answer) < 5_000
    assert len(status) < 10_000
    assert len(ready) < 10_000
    assert counted == "1"
