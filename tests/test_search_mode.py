"""Search mode as a client sees it: search_tools and call_tool in place of a long list, pinned
tools, policies, pagination, and list changes."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError

from agent_gateway.listing import PAGE_BYTES
from agent_gateway.search.tools import CALL_TOOL, SEARCH_TOOLS, WEAK
from agent_gateway.upstreams.connection import REFRESH_SPACING_MAX
from tests.servers import recorder
from tests.support import RunningGateway, running_gateway, serving_upstream
from tests.test_access import client_with
from tests.test_gateway import geo_upstream, modern_call
from tests.test_proxying import BOUND, Recorded, cancels

MODES = ["legacy", "auto"]
OWN = {SEARCH_TOOLS, CALL_TOOL, "ask_agent"}


def tracker_server(calls: list[str]) -> FastMCP:
    """An issue tracker with a dozen tools and one that adds a tool at run time."""
    server = FastMCP("tracker")

    @server.tool
    def create_issue(project: str, title: str) -> str:
        """Create a new issue in a project."""
        calls.append(f"create_issue {project} {title}")
        return f"created {title!r} in {project}"

    @server.tool
    def close_issue(project: str, number: int) -> str:
        """Close an issue."""
        calls.append(f"close_issue {project} {number}")
        return f"closed #{number}"

    @server.tool
    def delete_project(project: str) -> str:
        """Delete a whole project."""
        raise ToolError(f"project {project} is protected")

    for verb in ("list", "get", "update", "archive", "label", "assign", "comment", "watch"):
        server.tool(lambda: "ok", name=f"{verb}_project_thing", description=f"{verb.title()} project things.")

    @server.tool
    async def add_tool(name: str, description: str, ctx: Context) -> str:
        """Register a new tool (announces tools/list_changed)."""
        server.tool(lambda: name, name=name, description=description)
        await ctx.send_notification(types.ToolListChangedNotification())
        return name

    @server.tool
    async def describe_tool(name: str, description: str, ctx: Context) -> str:
        """Change an existing tool's description (announces tools/list_changed)."""
        server.local_provider.remove_tool(name)
        server.tool(lambda: name, name=name, description=description)
        await ctx.send_notification(types.ToolListChangedNotification())
        return name

    return server


@asynccontextmanager
async def tracker_gateway(
    search: dict[str, Any] | None = None, calls: list[str] | None = None, **extra: Any
) -> AsyncIterator[RunningGateway]:
    async with serving_upstream(tracker_server(calls if calls is not None else [])) as url:
        config = {"upstreams": {"tracker": {"url": url}}, "search": search or {"mode": "on"}, **extra}
        async with running_gateway(config) as gw:
            yield gw


def names(result: types.ListToolsResult) -> set[str]:
    return {t.name for t in result.tools}


def text_of(result: types.CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, types.TextContent))


def found(result: types.CallToolResult) -> list[str]:
    assert result.structured_content is not None, text_of(result)
    return [t["name"] for t in result.structured_content["tools"]]


@pytest.mark.parametrize("mode", MODES)
async def test_in_search_mode_a_client_lists_only_the_search_tools_and_reaches_everything_through_them(
    mode: str,
) -> None:
    calls: list[str] = []
    async with tracker_gateway(calls=calls) as gw, Client(gw.url, mode=mode) as client:
        assert names(await client.list_tools()) == OWN
        result = await client.call_tool(SEARCH_TOOLS, {"query": "open a new ticket"})
        assert found(result)[0] == "tracker__create_issue"
        entry = result.structured_content["tools"][0]  # type: ignore[index]
        assert entry["upstream"] == "tracker"
        assert 0 < entry["score"] <= 1
        assert entry["inputSchema"]["required"] == ["project", "title"]
        assert result.structured_content["total"] >= 1  # type: ignore[index]
        called = await client.call_tool(
            CALL_TOOL, {"name": "tracker__create_issue", "arguments": {"project": "web", "title": "login"}}
        )
        assert text_of(called) == "created 'login' in web"
        # A tool that is not listed is still called directly by its name.
        direct = await client.call_tool("tracker__close_issue", {"project": "web", "number": 7})
        assert text_of(direct) == "closed #7"
    assert calls == ["create_issue web login", "close_issue web 7"]


async def test_with_search_off_the_whole_catalog_is_listed_and_the_search_tools_do_not_exist() -> None:
    async with tracker_gateway({"mode": "off"}) as gw, Client(gw.url) as client:
        listed = names(await client.list_tools())
        assert "tracker__create_issue" in listed
        assert not listed & {SEARCH_TOOLS, CALL_TOOL}
        result = await client.call_tool(SEARCH_TOOLS, {"query": "issue"})
        assert result.is_error
        assert "Unknown tool" in text_of(result)


async def test_auto_turns_search_on_only_past_the_threshold() -> None:
    async with tracker_gateway({"mode": "auto", "threshold": 100}) as gw, Client(gw.url) as client:
        assert "tracker__create_issue" in names(await client.list_tools())
    # auto is the default: a file that only sets the threshold gets it.
    async with tracker_gateway({"threshold": 5}) as gw, Client(gw.url) as client:
        assert names(await client.list_tools()) == OWN


async def test_pinned_tools_are_listed_in_full_next_to_the_search_tools() -> None:
    search = {"mode": "on", "pinned": ["tracker__*_issue"]}
    async with tracker_gateway(search) as gw, Client(gw.url) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == OWN | {"tracker__create_issue", "tracker__close_issue"}
        assert listed["tracker__create_issue"].input_schema["required"] == ["project", "title"]


async def test_call_tool_carries_an_error_result_and_bad_input_back_as_results() -> None:
    async with tracker_gateway() as gw, Client(gw.url) as client:
        failed = await client.call_tool(
            CALL_TOOL, {"name": "tracker__delete_project", "arguments": {"project": "x"}}
        )
        assert failed.is_error
        assert "project x is protected" in text_of(failed)
        invalid = await client.call_tool(
            CALL_TOOL, {"name": "tracker__create_issue", "arguments": {"project": 1}}
        )
        assert invalid.is_error
        assert "Invalid arguments" in text_of(invalid)
        unknown = await client.call_tool(CALL_TOOL, {"name": "tracker__nope"})
        assert unknown.is_error
        assert "nope" in text_of(unknown)
        nested = await client.call_tool(CALL_TOOL, {"name": CALL_TOOL, "arguments": {"name": "x"}})
        assert nested.is_error
        assert "call 'call_tool' directly" in text_of(nested)
        empty = await client.call_tool(SEARCH_TOOLS, {"query": "  "})
        assert empty.is_error
        assert "query: must not be empty" in text_of(empty)
        too_many = await client.call_tool(SEARCH_TOOLS, {"query": "issue", "limit": 51})
        assert too_many.is_error
        # What a client sent is repeated clipped, never whole: a name longer than any public
        # name, a long value where the schema wants another type, a long request nothing serves.
        long_name = await client.call_tool(CALL_TOOL, {"name": "x" * 100_000})
        long_value = await client.call_tool(
            CALL_TOOL,
            {"name": "tracker__create_issue", "arguments": {"project": ["y" * 100_000], "title": "t"}},
        )
        long_query = await client.call_tool(SEARCH_TOOLS, {"query": "zqx " * 25_000})
        long_key = await client.call_tool(SEARCH_TOOLS, {"query": "issue", "k" * 100_000: 1})
    assert long_name.is_error
    assert f"name: '{'x' * 80}'... (100000 characters) is too long" in text_of(long_name)
    assert long_value.is_error
    assert "project: ['yyyy" in text_of(long_value)
    assert "characters) is not of type 'string'" in text_of(long_value)
    assert f"No tool matches '{'zqx ' * 20}'... (100000 characters)" in text_of(long_query)
    assert long_key.is_error
    assert "Additional properties are not allowed ('kkkk" in text_of(long_key)
    for answer in (long_name, long_value, long_query, long_key):
        assert len(text_of(answer)) < 700


async def test_search_tools_takes_a_limit_and_an_upstream() -> None:
    async with tracker_gateway() as gw, Client(gw.url) as client:
        assert len(found(await client.call_tool(SEARCH_TOOLS, {"query": "project", "limit": 3}))) == 3
        # JSON Schema's integers include 3.0: the same limit, not a failed search.
        whole = await client.call_tool(SEARCH_TOOLS, {"query": "project", "limit": 3.0})
        assert not whole.is_error, text_of(whole)
        assert len(found(whole)) == 3
        assert (
            found(await client.call_tool(SEARCH_TOOLS, {"query": "project", "upstream": "elsewhere"})) == []
        )


async def test_a_weak_match_is_said_to_be_one_in_the_listing_and_by_its_score() -> None:
    # The tool that archives is a strong match; the others share only "project" with the
    # request. A caller (a model reading the text) must be able to tell them apart.
    async with tracker_gateway() as gw, Client(gw.url) as client:
        result = await client.call_tool(SEARCH_TOOLS, {"query": "archive the project's invoices", "limit": 3})
    best, *rest = text_of(result).splitlines()[1:]
    assert best.startswith("- tracker__archive_project_thing [tracker, ")
    assert "(weak match)" not in best
    assert len(rest) == 2
    assert all("(weak match)" in line for line in rest)
    scores = [entry["score"] for entry in result.structured_content["tools"]]  # type: ignore[index]
    assert scores[0] >= WEAK > max(scores[1:])


@pytest.mark.parametrize("mode", MODES)
async def test_call_tool_relays_progress_under_the_clients_token(mode: str) -> None:
    seen = Recorded()
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async with (
        serving_upstream(recorder.build(seen.memory.append)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}, "search": {"mode": "on"}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        result = await client.call_tool(
            CALL_TOOL, {"name": "rec__steps", "arguments": {"count": 3}}, progress_callback=on_progress
        )
    assert not result.is_error
    assert [p for p, _, _ in received] == [1, 2, 3]


async def test_cancelling_call_tool_cancels_the_upstream_call_under_its_own_id() -> None:
    seen = Recorded()
    async with (
        serving_upstream(recorder.build(seen.memory.append)) as url,
        running_gateway(
            {"upstreams": {"rec": {"url": url, "protocol": "legacy"}}, "search": {"mode": "on"}}
        ) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        started: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, CALL_TOOL, {"name": "rec__wait", "arguments": {"seconds": 30}})
            started = (await seen.wait_for(lambda ev: any(e["event"] == "started" for e in ev)))[-1]
            tg.cancel_scope.cancel()
        # Both recorded, in either order (the handler is cancelled as the notification comes in).
        events = await seen.wait_for(
            lambda ev: any(e["event"] == "handler_cancelled" for e in ev) and bool(cancels(ev))
        )
    assert cancels(events) == [started["request_id"]]


async def test_a_restricted_client_never_finds_nor_calls_a_tool_outside_its_policy() -> None:
    tokens = {"full": "f" * 32, "narrow": "n" * 32}
    auth = {
        "mode": "bearer",
        "tokens": [
            {"name": "full", "sha256": hashlib.sha256(tokens["full"].encode()).hexdigest()},
            {
                "name": "narrow",
                "sha256": hashlib.sha256(tokens["narrow"].encode()).hexdigest(),
                "policy": "narrow",
            },
        ],
        "policies": {"narrow": {"tools": ["tracker__close_issue", "tracker__list_*"]}},
    }
    calls: list[str] = []
    async with tracker_gateway(calls=calls, auth=auth) as gw:
        async with client_with(gw.url, tokens["narrow"]) as narrow:
            hits = found(await narrow.call_tool(SEARCH_TOOLS, {"query": "create a new issue", "limit": 50}))
            assert "tracker__create_issue" not in hits
            assert set(hits) <= {"tracker__close_issue", "tracker__list_project_thing"}
            refused = await narrow.call_tool(
                CALL_TOOL, {"name": "tracker__create_issue", "arguments": {"project": "a", "title": "b"}}
            )
            assert refused.is_error
            assert "not allowed" in text_of(refused)
        async with client_with(gw.url, tokens["full"]) as full:
            assert "tracker__create_issue" in found(
                await full.call_tool(SEARCH_TOOLS, {"query": "create a new issue"})
            )
    assert calls == []


async def listed_by_gateway(gw: RunningGateway, name: str) -> None:
    """Wait until the gateway has re-listed the upstream that announced ``name``."""
    with anyio.fail_after(BOUND):
        while name not in gw.gateway.catalog.snapshot.tools:
            await anyio.sleep(0.01)


async def test_a_changed_catalog_is_searched_at_once_and_only_clients_whose_list_changed_are_told() -> None:
    told: dict[str, list[str]] = {"searching": []}

    def recorder_of(who: str) -> Any:
        async def record(message: IncomingMessage) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                told[who].append("tools")

        return record

    search = {"mode": "auto", "threshold": 0, "pinned": ["tracker__pinned_*"]}
    async with serving_upstream(tracker_server([])) as url:
        config = {
            "upstreams": {"tracker": {"url": url}, "other": {"url": url, "prefix": True}},
            "search": search,
        }
        async with (
            running_gateway(config) as gw,
            Client(gw.url, mode="legacy", message_handler=recorder_of("searching")) as searching,
        ):
            add = {"name": "frobnicate_widgets", "description": "Frobnicate the widgets of a project."}
            await searching.call_tool(CALL_TOOL, {"name": "tracker__add_tool", "arguments": add})
            await listed_by_gateway(gw, "tracker__frobnicate_widgets")
            hits = found(await searching.call_tool(SEARCH_TOOLS, {"query": "frobnicate widgets"}))
            assert hits[0] == "tracker__frobnicate_widgets"
            pinned = {"name": "pinned_report", "description": "A pinned report."}
            await searching.call_tool(CALL_TOOL, {"name": "tracker__add_tool", "arguments": pinned})
            with anyio.fail_after(REFRESH_SPACING_MAX + BOUND):  # after the first's spacing
                while not told["searching"]:
                    await anyio.sleep(0.01)
            assert "tracker__pinned_report" in names(await searching.list_tools(cache_mode="bypass"))
    # Told once, for the pinned tool; the unpinned one changed nothing it is listed.
    assert told["searching"] == ["tools"]


async def test_a_long_tool_list_comes_in_pages() -> None:
    async with tracker_gateway({"mode": "off"}, server={"page_size": 4}) as gw, Client(gw.url) as client:
        first = await client.list_tools()
        assert len(first.tools) == 4
        assert first.next_cursor is not None
        listed: list[str] = [t.name for t in first.tools]
        cursor = first.next_cursor
        while cursor is not None:
            page = await client.list_tools(cursor=cursor)
            listed += [t.name for t in page.tools]
            cursor = page.next_cursor
        assert len(listed) == len(set(listed)) == len(gw.gateway.catalog.snapshot.tools) + 1  # + ask_agent
        with pytest.raises(MCPError, match="invalid cursor"):
            await client.list_tools(cursor="not-ours")


async def test_a_page_of_large_tool_definitions_holds_fewer_tools() -> None:
    # Eight tools of ~50 KB and twelve small ones: a page of 100 would answer ~400 KB at once.
    server = FastMCP("big")
    for i in range(8):
        server.tool(lambda: "ok", name=f"big_{i}", description=f"A large definition {i}. " + "word " * 10_000)
    for i in range(12):
        server.tool(lambda: "ok", name=f"small_{i}", description=f"A small tool {i}.")
    server.tool(
        lambda: "ok", name="huge", description="One definition past the page's bytes. " + "x" * 200_000
    )
    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"big": {"url": url}}, "search": {"mode": "off"}}) as gw,
        Client(gw.url) as client,
    ):
        pages: list[list[types.Tool]] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            pages.append(page.tools)
            if (cursor := page.next_cursor) is None:
                break
        expected = len(gw.gateway.catalog.snapshot.tools) + 1  # + ask_agent
    listed = [t.name for page in pages for t in page]
    assert len(listed) == len(set(listed)) == expected  # all of them, each once
    wire = [sum(len(t.model_dump_json(by_alias=True, exclude_none=True)) for t in page) for page in pages]
    assert len(pages) >= 4
    # Each page within the bound, but for one that holds a single definition past it.
    assert all(size <= PAGE_BYTES * 1.1 or len(page) == 1 for size, page in zip(wire, pages, strict=True))
    assert ["big__huge"] in [[t.name for t in page] for page in pages]


async def test_a_renamed_tool_is_found_by_the_name_clients_call_it_by() -> None:
    """``rename`` gives a tool the name clients see and call: the index reads that name (and
    the upstream's own), so a request in the new name's words finds it, strongly."""
    server = FastMCP("billing")
    server.tool(lambda: "ok", name="op_17", description="Runs operation seventeen.")
    server.tool(lambda: "ok", name="op_18", description="Runs operation eighteen.")
    async with serving_upstream(server) as url:
        config = {
            "upstreams": {"billing": {"url": url, "rename": {"op_17": "send_invoice"}}},
            "search": {"mode": "on"},
        }
        async with running_gateway(config) as gw, Client(gw.url) as client:
            found = await client.call_tool(SEARCH_TOOLS, {"query": "send an invoice"})
            by_old_name = await client.call_tool(SEARCH_TOOLS, {"query": "op 17"})
    assert found.structured_content is not None
    assert by_old_name.structured_content is not None
    top = found.structured_content["tools"][0]
    assert (top["name"], top["score"] >= 0.25) == ("billing__send_invoice", True), text_of(found)
    assert by_old_name.structured_content["tools"][0]["name"] == "billing__send_invoice"


async def test_a_modern_client_calls_an_unlisted_tool_with_header_arguments_by_its_name() -> None:
    # A tool not listed (search mode) declares an argument repeated in an Mcp-Param header: a
    # modern client learns the declarations from tools/list, so it sends no header, and the
    # gateway refused its direct call (HEADER_MISMATCH) though call_tool served it. A client
    # that does send the header (it read the declaration in search_tools' result) is still
    # held to it.
    async with (
        serving_upstream(geo_upstream()) as url,
        running_gateway({"upstreams": {"geo": {"url": url}}, "search": {"mode": "on"}}) as gw,
        Client(gw.url, mode="auto") as client,
        httpx.AsyncClient() as http,
    ):
        assert "geo__locate" not in names(await client.list_tools())
        direct = await client.call_tool("geo__locate", {"region": "eu"})
        body, headers = modern_call("geo__locate", "eu")
        disagreeing = await http.post(gw.url, json=body, headers=headers | {"mcp-param-region": "us"})
    assert (direct.is_error, text_of(direct)) == (False, "located in eu")
    assert disagreeing.json()["error"]["code"] == types.HEADER_MISMATCH
