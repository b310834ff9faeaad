"""Resource templates in numbers: what a read of a URI no template serves costs is the
templates' literal text, compared at C speed, not a Python scan of the URI per template (a
client's 8 KiB URI against 1,000 templates held the event loop 1.1 s a read); a catalog
change parses only the templates that changed (each parsed every template again: 5 s for
5,000 of 100 variables); a template of more than 16 variables is not served."""

from __future__ import annotations

import contextlib
import inspect
import tracemalloc
from typing import Any

import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import UriTemplate

from agent_gateway.catalog import build_snapshot
from agent_gateway.catalog_parts import Listing
from agent_gateway.catalog_resources import MATCHED, MAX_VARIABLES, READ_SCAN
from agent_gateway.config_files import parse_config
from agent_gateway.errors import UnknownName
from tests.faults.harness import wait_until
from tests.support import running_gateway, serving, serving_upstream

TEMPLATES = 200


def many_templates() -> FastMCP:
    server = FastMCP("files")

    def reader(index: int) -> Any:
        def read(name: str) -> str:
            return f"t{index} {name}"

        return read

    for index in range(TEMPLATES):
        server.resource(f"file:///t{index}/{{name}}", name=f"t{index}")(reader(index))
    for count in (MAX_VARIABLES, MAX_VARIABLES + 1):
        template, read = wide(count)
        server.resource(template, name=f"wide{count}")(read)
    return server


def wide(count: int) -> tuple[str, Any]:
    """``file:///wide{count}/{v0}/…`` of ``count`` variables, and its reader."""
    names = [f"v{n}" for n in range(count)]

    def read(**values: str) -> str:
        return f"{len(values)} values"

    kind = inspect.Parameter.KEYWORD_ONLY
    read.__signature__ = inspect.Signature([inspect.Parameter(n, kind, annotation=str) for n in names])  # type: ignore[attr-defined]
    read.__annotations__ = {n: str for n in names} | {"return": str}
    return f"file:///wide{count}" + "".join(f"/{{{n}}}" for n in names), read


def grower() -> FastMCP:
    """An upstream that adds a tool at run time, and says so: a catalog change of its own."""
    server = FastMCP("grower")

    @server.tool
    async def add_tool(name: str, ctx: Context) -> str:
        server.tool(lambda: name, name=name, description=f"the tool {name}")
        await ctx.send_notification(types.ToolListChangedNotification())
        return name

    return server


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The templates parsed (every parse, whoever asked)."""
    seen: list[str] = []
    parse = UriTemplate.parse

    def counted(template: str, **options: Any) -> UriTemplate:
        seen.append(template)
        return parse(template, **options)

    monkeypatch.setattr(UriTemplate, "parse", counted)
    return seen


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URIs each template's matcher was run on (every scan, whichever template)."""
    seen: list[str] = []
    match = UriTemplate.match

    def counted(self: UriTemplate, uri: str, **options: Any) -> Any:
        seen.append(uri)
        return match(self, uri, **options)

    monkeypatch.setattr(UriTemplate, "match", counted)
    return seen


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_read_no_templates_literal_text_fits_scans_none_of_them(mode: str, scans: list[str]) -> None:
    async with (
        serving_upstream(many_templates()) as url,
        running_gateway({"upstreams": {"files": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        with pytest.raises(MCPError, match="Resource not found"):
            await client.read_resource("file:///nothing/" + "a" * 8_000)
        # Before, every template scanned the 8 KB URI, twice (its span, its read).
        assert [uri for uri in scans if uri.startswith("file:///nothing/")] == []
        read = await client.read_resource("file:///t7/readme")
    assert read.contents[0] == types.TextResourceContents(
        uri="file:///t7/readme", mime_type=read.contents[0].mime_type, text="t7 readme"
    )


async def test_another_upstreams_change_parses_none_of_the_templates_again(parses: list[str]) -> None:
    async with (
        serving_upstream(many_templates()) as files,
        serving_upstream(grower()) as grows,
        running_gateway({"upstreams": {"files": {"url": files}, "grower": {"url": grows}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        catalog = gw.gateway.catalog
        assert "file:///t7/{name}" in parses
        parses.clear()
        await client.call_tool("grower__add_tool", {"name": "later"})
        await wait_until(lambda: "grower__later" in catalog.snapshot.tools)
        assert "grower__later" in {t.name for t in (await client.list_tools()).tools}
        # Before, every catalog change parsed every template again, whichever upstream changed.
        assert [template for template in parses if template.startswith("file:///")] == []
        read = await client.read_resource("file:///t7/readme")
        assert isinstance(read.contents[0], types.TextResourceContents)
        assert read.contents[0].text == "t7 readme"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_template_of_more_variables_than_the_bound_is_not_served(mode: str) -> None:
    async with (
        serving_upstream(many_templates()) as url,
        running_gateway({"upstreams": {"files": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        shown: set[str] = set()
        cursor: str | None = None
        while True:
            page = await client.list_resource_templates(cursor=cursor)
            shown |= {t.uri_template for t in page.resource_templates}
            if (cursor := page.next_cursor) is None:
                break
        assert wide(MAX_VARIABLES)[0] in shown
        assert wide(MAX_VARIABLES + 1)[0] not in shown
        served = await client.read_resource(f"file:///wide{MAX_VARIABLES}" + "/a" * MAX_VARIABLES)
        assert isinstance(served.contents[0], types.TextResourceContents)
        assert served.contents[0].text == f"{MAX_VARIABLES} values"
        with pytest.raises(MCPError, match="Resource not found"):
            await client.read_resource(f"file:///wide{MAX_VARIABLES + 1}" + "/a" * (MAX_VARIABLES + 1))


def bare_templates(reads: list[str]) -> Server:
    """A low-level upstream listing 100 templates of no literal text (``{v0}``…), which every
    URI may match, and reading whatever it is asked (recorded)."""

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        listed = [types.ResourceTemplate(uri_template=f"{{v{i}}}", name=f"v{i}") for i in range(100)]
        return types.ListResourceTemplatesResult(resource_templates=listed)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        reads.append(params.uri)
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="read")])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    return Server(
        "bare",
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_long_uri_against_templates_of_no_literal_text_is_scanned_within_a_bound(
    mode: str, scans: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    reads: list[str] = []
    long = "x://" + "a." * 4_090  # 8 KB (a client's bound): each try scans it all, failing at its end
    async with (
        serving(bare_templates(reads).streamable_http_app()) as base,
        running_gateway({"upstreams": {"bare": {"url": f"{base}/mcp"}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        refusal: MCPError | None = None
        try:
            await client.read_resource(long)
        except MCPError as exc:
            refusal = exc
        short = texts(await client.read_resource("short"))
    assert refusal is not None
    assert "given up matching its 8184 characters" in refusal.error.message
    assert refusal.error.code == types.INVALID_PARAMS
    assert short == ["read"]
    # One refusal, counted and logged once (its span's lookup gives it up too, silently).
    lines = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.refusals"]
    assert len([line for line in lines if line.startswith("refused a resource of")]) == 1, lines
    # Before: 100 scans of 8 KB for the read, and as many for its span (47 ms each time; at
    # 1,000 such templates, 0.5 s); then at most READ_SCAN characters each (about 15 ms); now
    # the read's lookups share one match (catalog_resources.Matches).
    assert sum(len(uri) for uri in scans if uri == long) <= READ_SCAN
    # A URI read is matched once, not by its span, its route and its contents' URI each.
    assert scans.count("short") == 1, scans.count("short")
    assert reads == ["short"]


def texts(read: types.ReadResourceResult) -> list[str]:
    return [c.text for c in read.contents if isinstance(c, types.TextResourceContents)]


def test_the_matches_a_snapshot_keeps_hold_about_their_bound_in_memory() -> None:
    # Each URI a client reads is kept with its match, up to MATCHED characters of URIs: a
    # client reading short fresh URIs (a:0, a:1, ...) made it hold 190,000 of them, each an
    # entry and a string of some 90 bytes, 18 MB for its "1 MiB".
    config = parse_config({"upstreams": {"up": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="test")
    listed = (types.ResourceTemplate(uri_template="file:///{name}", name="files"),)
    snapshot = build_snapshot(config, {"up": Listing(templates=listed)}, version=1)
    tracemalloc.start()
    try:
        for n in range(MATCHED // 7):  # 7 characters each (a:10000, a:10001, ...): none forgotten
            with contextlib.suppress(UnknownName):
                snapshot.resource(f"a:{n + 0x10000:x}")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2 * MATCHED, held
