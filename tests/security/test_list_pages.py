"""A page of ``prompts/list``, ``resources/list`` or ``resources/templates/list`` costs a page,
not the catalog: FastMCP's handlers made every item the client may see a wire model for each
page (at 3,000 prompts, 50 ms of the event loop for a page of ten; a client walking the list,
O(catalog²)). The list is now made once per catalog version and policy. A cursor is still a
position in the asking client's own list: one taken under another policy shows it nothing
its own policy hides. Found by a helper's attack (round AU)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_gateway.components import ListedPrompt, ListedResource, ListedTemplate
from tests.faults.harness import text_of, wait_until
from tests.support import running_gateway, serving_upstream

COUNT = 40
PAGE = 4
WIDE, NARROW = "wide-token-0123456789abcdef", "narrow-token-0123456789abcdef"


def _text(value: str) -> Callable[[], str]:
    def read() -> str:
        return value

    return read


def catalog_server() -> FastMCP:
    server = FastMCP("up")
    for i in range(COUNT):
        server.prompt(name=f"p{i:03d}")(_text(str(i)))
        server.resource(f"res://r/{i:03d}", name=f"r{i:03d}")(_text(str(i)))

        def by_template(x: str) -> str:
            return x

        server.resource(f"tpl://t{i:03d}/{{x}}", name=f"t{i:03d}")(by_template)
    return server


@asynccontextmanager
async def client_with(url: str, token: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


@asynccontextmanager
async def gateway() -> AsyncIterator[str]:
    narrow = {"prompts": ["up__p00*"], "resources": ["res://r/00*", "tpl://t00*"]}
    config = {
        "server": {"page_size": PAGE},
        "auth": {
            "mode": "bearer",
            "tokens": [
                {"name": "wide", "token": WIDE, "policy": "wide"},
                {"name": "narrow", "token": NARROW, "policy": "narrow"},
            ],
            "policies": {"wide": {}, "narrow": narrow},
        },
    }
    async with (
        serving_upstream(catalog_server()) as url,
        running_gateway({**config, "upstreams": {"up": {"url": url}}}) as gw,
    ):
        yield gw.url


Page = Callable[[Client, str | None], Awaitable[tuple[list[str], str | None]]]


async def prompts(client: Client, cursor: str | None) -> tuple[list[str], str | None]:
    page = await client.list_prompts(cursor=cursor, cache_mode="bypass")
    return [p.name for p in page.prompts], page.next_cursor


async def resources(client: Client, cursor: str | None) -> tuple[list[str], str | None]:
    page = await client.list_resources(cursor=cursor, cache_mode="bypass")
    return [str(r.uri) for r in page.resources], page.next_cursor


async def templates(client: Client, cursor: str | None) -> tuple[list[str], str | None]:
    page = await client.list_resource_templates(cursor=cursor, cache_mode="bypass")
    return [t.uri_template for t in page.resource_templates], page.next_cursor


LISTS = {
    "prompts": (prompts, ListedPrompt, "to_mcp_prompt"),
    "resources": (resources, ListedResource, "to_mcp_resource"),
    "templates": (templates, ListedTemplate, "to_mcp_template"),
}


async def walked(client: Client, page: Page) -> tuple[list[str], list[str | None]]:
    """Every item of the list, page by page, and the cursor each page was asked with."""
    items, cursors, cursor = list[str](), list[str | None](), None
    while True:
        cursors.append(cursor)
        found, cursor = await page(client, cursor)
        items += found
        if cursor is None:
            return items, cursors


@pytest.mark.parametrize("kind", LISTS)
async def test_walking_a_list_makes_each_item_once_not_once_a_page(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, component, conversion = LISTS[kind]
    made = [0]
    original = getattr(component, conversion)

    def counted(self: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return original(self, **kwargs)

    monkeypatch.setattr(component, conversion, counted)
    async with gateway() as url, client_with(url, WIDE) as client:
        made[0] = 0  # the upstream's own listing (an in-process FastMCP) is not the gateway's
        items, cursors = await walked(client, page)
        again, _ = await walked(client, page)
    assert len(cursors) == COUNT // PAGE
    assert len(items) == len(set(items)) == COUNT
    assert again == items
    assert made[0] == COUNT  # was COUNT a page: 400 for 10 pages, 800 for the second walk


@pytest.mark.parametrize("kind", LISTS)
async def test_a_cursor_of_another_policys_walk_shows_only_the_askers_own_list(kind: str) -> None:
    page = LISTS[kind][0]
    async with gateway() as url, client_with(url, WIDE) as wide, client_with(url, NARROW) as narrow:
        own, _ = await walked(narrow, page)  # the narrow list made first, then the wide one
        everything, cursors = await walked(wide, page)
        replayed = [item for cursor in cursors for item in (await page(narrow, cursor))[0]]
        again, _ = await walked(narrow, page)
        with pytest.raises(MCPError, match="invalid cursor for") as refused:
            await page(narrow, "not-a-cursor")
    assert len(own) == 10
    assert set(own) < set(everything)
    assert replayed == own  # its pages past its own end are empty
    assert again == own
    assert refused.value.error.code == -32602


async def tools(client: Client, cursor: str | None) -> tuple[list[str], str | None]:
    page = await client.list_tools(cursor=cursor, cache_mode="bypass")
    return [t.name for t in page.tools], page.next_cursor


def encoded(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


# Python's int() reads Arabic-Indic and full-width digits, which str.isdigit() lets through.
OTHER_DIGITS = ["\u0663", "\uff13", "\u0661\u0660", "03"]


@pytest.mark.parametrize("kind", ["tools", *LISTS])
async def test_a_cursor_spelling_its_offset_in_other_digits_is_an_invalid_cursor(kind: str) -> None:
    page = tools if kind == "tools" else LISTS[kind][0]
    forged = [encoded(f"tools:{digits}") for digits in OTHER_DIGITS]
    forged += [encoded(f'{{"o": {digits}}}') for digits in OTHER_DIGITS]
    async with gateway() as url, client_with(url, WIDE) as client:
        for cursor in forged:
            with pytest.raises(MCPError, match="invalid cursor for") as refused:
                await page(client, cursor)
            assert refused.value.error.code == -32602, cursor


def large_items_server() -> FastMCP:
    """Three small tools, prompts, resources and templates, then three of ~200 KB each (within
    what one item may hold, 1 MiB): a tool's in its ``_meta``, the others' in a description."""
    server = FastMCP("up")
    for i in range(6):
        words = "w" * (200_000 if i >= 3 else 10)
        server.tool(name=f"t{i}", meta={"words": words})(_text(str(i)))
        server.prompt(name=f"p{i}", description=words)(_text(str(i)))
        server.resource(f"res://r/{i}", name=f"r{i}", description=words)(_text(str(i)))

        def by_template(x: str) -> str:
            return x

        server.resource(f"tpl://t{i}/{{x}}", name=f"t{i}", description=words)(by_template)
    return server


@pytest.mark.parametrize("kind", ["tools", *LISTS])
async def test_a_page_of_a_list_ends_before_its_items_pass_the_bytes_of_a_tools_page(kind: str) -> None:
    # Before, a page held page_size items (100 by default) whatever their size: 64 items of
    # 1 MB (one upstream's 64 MiB) made every client's page 64 MB; a tool's _meta was not
    # counted in its page's bytes.
    page = tools if kind == "tools" else LISTS[kind][0]
    async with (
        serving_upstream(large_items_server()) as url,
        running_gateway({"upstreams": {"up": {"url": url}}}) as gw,
        Client(gw.url) as client,
    ):
        items, cursors = await walked(client, page)
    assert len(items) == len(set(items)) == 6 + (kind == "tools")  # and ask_agent
    assert len(cursors) == 4  # the small ones together, each large one alone


def shifting_server(name: str, count: int) -> FastMCP:
    """``count`` tools, prompts, resources and templates (``{name}0`` ...), and a tool ``shift``
    that removes the second to the fourth of each and adds three, then says its lists changed."""
    server = FastMCP(name)
    server.tool(name="shift")(shift_of(server, name))
    for i in range(count):
        add(server, f"{name}{i}")
    return server


def add(server: FastMCP, item: str) -> None:
    server.tool(name=item)(_text(item))
    server.prompt(name=item)(_text(item))
    server.resource(f"res://{item}", name=item)(_text(item))

    def by_template(x: str) -> str:
        return x

    server.resource(f"tpl://{item}/{{x}}", name=item)(by_template)


def shift_of(server: FastMCP, name: str) -> Callable[[Context], Awaitable[str]]:
    async def shift(ctx: Context) -> str:
        for i in range(1, 4):
            server.local_provider.remove_tool(f"{name}{i}")
            server.local_provider.remove_prompt(f"{name}{i}")
            server.local_provider.remove_resource(f"res://{name}{i}")
            server.local_provider.remove_template(f"tpl://{name}{i}/{{x}}")
            add(server, f"new{i}")
        for notification in (
            types.ToolListChangedNotification(),
            types.PromptListChangedNotification(),
            types.ResourceListChangedNotification(),
        ):
            await ctx.send_notification(notification)
        return "shifted"

    return shift


@pytest.mark.parametrize("kind", ["tools", *LISTS])
async def test_a_walk_across_a_catalog_change_sees_each_item_that_stayed_once(kind: str) -> None:
    # Upstream a, listed first, drops three items (the page's last among them) and adds three
    # after the walk's first page. Before, the walk went on from the same position in the
    # changed list, missing items that never changed.
    page = tools if kind == "tools" else LISTS[kind][0]
    async with (
        serving_upstream(shifting_server("a", 6)) as a,
        serving_upstream(shifting_server("b", 6)) as b,
        running_gateway({"server": {"page_size": 4}, "upstreams": {"a": {"url": a}, "b": {"url": b}}}) as gw,
        Client(gw.url) as client,
    ):
        first, cursor = await page(client, None)
        before, _ = await walked(client, page)
        assert text_of(await client.call_tool("a__shift", {})) == "shifted"
        snapshot = lambda: gw.gateway.catalog.snapshot  # noqa: E731
        await wait_until(lambda: "a__a1" not in snapshot().prompts and "res://a1" not in snapshot().resources)
        rest, following = await page(client, cursor)
        while following is not None:
            found, following = await page(client, following)
            rest += found
        after, _ = await walked(client, page)
    seen = first + rest
    assert len(seen) == len(set(seen))
    assert set(before) & set(after) <= set(seen)  # before: 1 or 2 that stayed were missed
