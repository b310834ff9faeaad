"""Resource links an upstream hands out (in a tool's result, a prompt's messages, a read's
contents) carry URIs a client of the gateway can read, and a read of one reaches the upstream
that handed it out: the upstream records every URI it is asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.uri_template import UriTemplate

from agent_gateway.catalog import build_snapshot
from agent_gateway.catalog_parts import Listing
from agent_gateway.config_files import parse_config
from agent_gateway.resource_links import LOOKUPS, SCANNED, linked_result
from tests.servers import recorder
from tests.support import running_gateway, serving, serving_upstream
from tests.test_access import client_with

NARROW = "n" * 32
TEMPLATES = 200


def linker(reads: list[str]) -> Server:
    """An upstream listing ``solo://a`` and the templates ``t0://{n}`` to ``t199://{n}``, whose
    tool ``make`` and prompt hand out links to ``solo://a``, to ``shared://readme`` (which
    ``other`` lists) and to URIs nobody lists, and whose tool ``many`` ``count`` links (to
    ``t0://…``, the last to ``solo://a``); it reads any URI, and ``made://dir`` as a directory of one child."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        tools = [types.Tool(name=name, input_schema={"type": "object"}) for name in ("make", "many")]
        return types.ListToolsResult(tools=tools)

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        listed = [
            types.ResourceTemplate(uri_template=f"t{i}://{{n}}", name=f"t{i}") for i in range(TEMPLATES)
        ]
        return types.ListResourceTemplatesResult(resource_templates=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "many":
            count = (params.arguments or {})["count"]
            links = [types.ResourceLink(uri=f"t0://{n}", name="t") for n in range(count - 1)]
            return types.CallToolResult(content=[*links, types.ResourceLink(uri="solo://a", name="a")])
        made = types.TextResourceContents(uri="made://embedded", text="inline")
        return types.CallToolResult(
            content=[
                types.TextContent(text="made a report"),
                types.ResourceLink(uri="made://report/1", name="report"),
                types.ResourceLink(uri="shared://readme", name="readme"),
                types.ResourceLink(uri="solo://a", name="a"),
                types.ResourceLink(uri="https://example.org/report", name="on the web"),
                types.EmbeddedResource(resource=made),
            ]
        )

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri="solo://a", name="a")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        reads.append(params.uri)
        contents: list[types.TextResourceContents | types.BlobResourceContents] = [
            types.TextResourceContents(uri=params.uri, text=f"linker's {params.uri}")
        ]
        if params.uri == "made://dir":
            contents.append(types.TextResourceContents(uri="made://dir/child", text="a child"))
        return types.ReadResourceResult(contents=contents)

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="brief")])

    async def get_prompt(ctx: Any, params: Any) -> types.GetPromptResult:
        link = types.ResourceLink(uri="made://brief", name="brief")
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=link)])

    return Server(
        "linker",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


def other() -> FastMCP:
    server = FastMCP("other")
    server.resource("shared://readme", name="readme")(lambda: "other's readme")
    return server


@asynccontextmanager
async def linked_gateway(reads: list[str], **config: Any) -> AsyncIterator[str]:
    async with (
        serving(linker(reads).streamable_http_app()) as base,
        serving_upstream(other()) as second,
    ):
        upstreams = {"linker": {"url": f"{base}/mcp"}, "other": {"url": second}}
        async with running_gateway({"upstreams": upstreams, **config}) as gw:
            yield gw.url


def texts(read: types.ReadResourceResult) -> list[tuple[str, str]]:
    return [(c.uri, c.text) for c in read.contents if isinstance(c, types.TextResourceContents)]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_tools_links_are_read_from_the_upstream_that_made_them(mode: str) -> None:
    reads: list[str] = []
    async with linked_gateway(reads) as url, Client(url, mode=mode) as client:
        result = await client.call_tool("linker__make", {})
        links = [block.uri for block in result.content if isinstance(block, types.ResourceLink)]
        embedded = [
            block.resource.uri for block in result.content if isinstance(block, types.EmbeddedResource)
        ]
        read = [texts(await client.read_resource(uri)) for uri in links if "+" in uri]
    # Before: made://report/1 (listed by nobody: "Resource not found") and shared://readme,
    # which the catalog serves as other's (read from other).
    # A web address is kept: it names the same page whoever reads it.
    assert links == [
        "linker+made://report/1",
        "linker+shared://readme",
        "solo://a",
        "https://example.org/report",
    ]
    assert embedded == ["linker+made://embedded"]
    assert read == [
        [("linker+made://report/1", "linker's made://report/1")],
        [("linker+shared://readme", "linker's shared://readme")],
    ]
    assert reads == ["made://report/1", "shared://readme"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_prompts_links_and_a_reads_other_contents_carry_public_uris(mode: str) -> None:
    reads: list[str] = []
    async with linked_gateway(reads) as url, Client(url, mode=mode) as client:
        prompt = await client.get_prompt("linker__brief")
        link = prompt.messages[0].content
        assert isinstance(link, types.ResourceLink)
        brief = texts(await client.read_resource(link.uri)) if "+" in link.uri else []
        directory = texts(await client.read_resource("linker+made://dir"))
    assert link.uri == "linker+made://brief"
    assert brief == [("linker+made://brief", "linker's made://brief")]
    # Before, the child kept the upstream's URI, which nobody's in the catalog serves.
    assert directory == [("linker+made://dir", "linker's made://dir"), ("linker+made://dir/child", "a child")]
    assert reads == ["made://brief", "made://dir"]


async def test_a_link_is_read_only_where_the_policy_allows_its_public_uri() -> None:
    reads: list[str] = []
    auth = {
        "mode": "bearer",
        "tokens": [{"name": "narrow", "token": NARROW, "policy": "narrow"}],
        "policies": {"narrow": {"resources": ["linker+made://report/*", "solo://*"]}},
    }
    async with linked_gateway(reads, auth=auth) as url, client_with(url, NARROW) as client:
        assert texts(await client.read_resource("linker+made://report/1"))[0][1] == "linker's made://report/1"
        # An alias of a URI the catalog serves as linker's is matched as that URI.
        assert texts(await client.read_resource("linker+solo://a")) == [
            ("linker+solo://a", "linker's solo://a")
        ]
        for refused in ("linker+made://secret", "linker+shared://readme", "nobody+made://report/1"):
            with pytest.raises(MCPError, match="Resource not found"):
                await client.read_resource(refused)
    assert reads == ["made://report/1", "solo://a"]


async def test_many_links_against_many_templates_are_qualified_unmatched_and_stay_readable() -> None:
    reads: list[str] = []
    async with linked_gateway(reads) as url, Client(url, mode="legacy") as client:
        few = await client.call_tool("linker__many", {"count": LOOKUPS // TEMPLATES})
        many = await client.call_tool("linker__many", {"count": LOOKUPS // TEMPLATES + 1})
        links = [block.uri for block in many.content if isinstance(block, types.ResourceLink)]
        read = texts(await client.read_resource(links[-2]))
    # Within the bound each link is matched against the templates: t0://{n} is linker's own.
    assert [block.uri for block in few.content if isinstance(block, types.ResourceLink)][:2] == [
        "t0://0",
        "t0://1",
    ]
    # Past it, one not listed is qualified without a match, and is read from its upstream; one
    # the catalog lists as the upstream's own keeps its URI.
    assert links[:2] + links[-1:] == ["linker+t0://0", "linker+t0://1", "solo://a"]
    assert read == [(links[-2], f"linker's t0://{len(links) - 2}")]
    assert reads == [f"t0://{len(links) - 2}"]


def test_long_links_against_templates_with_no_literal_text_are_scanned_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every URI may match a template with no literal text ({v0}, {v1}...): each try is the
    # matcher's Python scan of the whole URI (about 9 ms for 60 KB). LOOKUPS alone lets these
    # three links (300 tries) be scanned against all 100 templates: 1.8 s of the event loop
    # (a link against 1,000 of them: 3.7 s).
    config = parse_config({"upstreams": {"up": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="test")
    listed = tuple(types.ResourceTemplate(uri_template=f"{{v{i}}}", name=f"t{i}") for i in range(100))
    snapshot = build_snapshot(config, {"up": Listing(templates=listed)}, version=1)
    scanned: list[int] = []
    match = UriTemplate.match

    def counted(self: UriTemplate, uri: str, **options: Any) -> Any:
        scanned.append(len(uri))
        return match(self, uri, **options)

    monkeypatch.setattr(UriTemplate, "match", counted)  # the SDK's matcher, counted as it runs
    long = "x://" + "a." * 30_000
    content: list[types.ContentBlock] = [types.ResourceLink(uri=f"{long}{n}", name="x") for n in range(2)]
    result = types.CallToolResult(content=[*content, types.ResourceLink(uri="x://short", name="s")])
    assert len(result.content) * len(snapshot.templates) <= LOOKUPS
    links = [
        b.uri for b in linked_result(result, "up", snapshot).content if isinstance(b, types.ResourceLink)
    ]
    assert sum(scanned) <= SCANNED
    # Past the bound, qualified without a try: still read from their upstream.
    assert links == [f"up+{long}0", f"up+{long}1", "up+x://short"]
    assert snapshot.resource(links[0]) == ("up", f"{long}0")


async def test_an_alias_subscribed_under_a_narrow_policy_is_sent_its_updates() -> None:
    # The policy allows counter://*: the subscription to rec+counter://value is matched as
    # counter://value (the URI the catalog serves as rec's own) and accepted; before, each of
    # its updates was matched as rec+counter://value, and held back.
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    auth = {
        "mode": "bearer",
        "tokens": [{"name": "narrow", "token": NARROW, "policy": "narrow"}],
        "policies": {"narrow": {"resources": ["counter://*"]}},
    }
    async with (
        serving_upstream(recorder.build(lambda _: None)) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}, "auth": auth}) as gw,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {NARROW}"}) as http,
        Client(
            streamable_http_client(gw.url, http_client=http), mode="legacy", message_handler=on_message
        ) as client,
    ):
        with pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource("rec+counter://value")
        await client.call_tool("rec__updates", {"uri": "counter://value", "times": 1})
        with anyio.fail_after(10):
            while not updates:
                await anyio.sleep(0.02)
    assert updates == ["rec+counter://value"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstreams_refusal_of_a_namespaced_read_names_the_uri_the_client_read(mode: str) -> None:
    async with linked_gateway([]) as url, Client(url, mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.read_resource("other+made://nothing")
    # FastMCP's refusal, its code and message kept; before, its data named made://nothing,
    # which in the catalog is nobody's.
    assert "Resource not found" in refused.value.error.message
    assert refused.value.error.data == {"uri": "other+made://nothing"}
