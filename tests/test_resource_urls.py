"""A resource URI an upstream lists that is no URL (a space or a control character in its
host) is left out of the listing alone: FastMCP lists resources as URLs, and before, one such
URI failed the building of every listing, so every client's ``resources/list``,
``prompts/list`` and ``resources/templates/list`` came back empty and every read failed
(``Invalid request parameters``), whatever upstream it was for."""

from __future__ import annotations

import sys

import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client

from tests.support import SERVERS, running_gateway, serving_upstream


def good() -> FastMCP:
    server = FastMCP("good")
    server.resource("file:///ok", name="ok")(lambda: "ok")
    server.resource("file:///items/{item}", name="item")(lambda item: f"item {item}")
    server.prompt(lambda: "hello", name="hello")
    return server


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_resource_uri_that_is_no_url_is_left_out_alone(mode: str) -> None:
    bad = {"command": sys.executable, "args": [str(SERVERS / "hostile_listings.py"), "badurl"]}
    async with (
        serving_upstream(good()) as url,
        running_gateway({"upstreams": {"good": {"url": url}, "bad": bad}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        assert "data://a host\n/x" in gw.gateway.catalog.snapshot.resources  # listed upstream
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        assert uris == {"file:///ok", "file:///fine"}
        assert [p.name for p in (await client.list_prompts()).prompts] == ["good__hello"]
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["file:///items/{item}"]
        read = await client.read_resource("file:///ok")
        fine = await client.read_resource("file:///fine")
    assert isinstance(read.contents[0], types.TextResourceContents)
    assert read.contents[0].text == "ok"
    assert isinstance(fine.contents[0], types.TextResourceContents)
    assert fine.contents[0].text == "badurl"
