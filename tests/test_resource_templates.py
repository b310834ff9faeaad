"""Reads matched against many resource templates: what a read of a URI no template serves
costs is the templates' literal text, compared at C speed, not a Python scan of the URI per
template (a client's 8 KiB URI against 1,000 templates held the event loop 1.1 s a read)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import UriTemplate

from tests.support import running_gateway, serving_upstream

TEMPLATES = 200


def many_templates() -> FastMCP:
    server = FastMCP("files")

    def reader(index: int) -> Any:
        def read(name: str) -> str:
            return f"t{index} {name}"

        return read

    for index in range(TEMPLATES):
        server.resource(f"file:///t{index}/{{name}}", name=f"t{index}")(reader(index))
    return server


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
