"""A read by an alias in an upstream's namespace (``docs+sec://…``) is allowed only where the
client's policy allows the URI the catalog serves it by: neither a web address's spelling nor a
match against the templates given up (``READ_SCAN``) lets it be matched as anything looser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from tests.support import running_gateway, serving
from tests.test_access import client_with

NARROW = "n" * 32
PADDED = "sec://secret/" + "a" * 8000
"""A URI docs's catch-all serves: longer than its other templates' matchers may all scan."""


def templated(name: str, templates: list[str], text: str, reads: list[str] | None = None) -> Server:
    """An upstream ``name`` listing ``templates`` and no resource, reading any URI as ``text``
    (recording each in ``reads``)."""

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        listed = [types.ResourceTemplate(uri_template=t, name=t) for t in templates]
        return types.ListResourceTemplatesResult(resource_templates=listed)

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if reads is not None:
            reads.append(params.uri)
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text=text)])

    return Server(
        name,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


def docs(reads: list[str]) -> Server:
    """An upstream templating ``sec://{a0}`` … ``sec://{a7}`` (one path segment) and the
    catch-all ``sec://{+path}``, and serving ``https://…`` too (an intranet fetcher)."""
    return templated("docs", [f"sec://{{a{i}}}" for i in range(8)] + ["sec://{+path}"], "secret", reads)


def web() -> Server:
    """An upstream serving any web page (``https://{+rest}``): the one a narrow client may read."""
    return templated("web", ["https://{+rest}"], "page")


@asynccontextmanager
async def narrow_gateway(reads: list[str], allowed: list[str]) -> AsyncIterator[str]:
    auth = {
        "mode": "bearer",
        "tokens": [{"name": "narrow", "token": NARROW, "policy": "narrow"}],
        "policies": {"narrow": {"resources": allowed}},
    }
    async with (
        serving(docs(reads).streamable_http_app()) as first,
        serving(web().streamable_http_app()) as second,
    ):
        upstreams = {"docs": {"url": f"{first}/mcp"}, "web": {"url": f"{second}/mcp"}}
        async with running_gateway({"upstreams": upstreams, "auth": auth}) as gw:
            yield gw.url


async def test_an_alias_of_a_templated_uri_is_refused_when_its_match_is_given_up() -> None:
    # docs+* allows what docs makes and lists nowhere; sec://secret/… is docs's templated URI,
    # which the policy does not allow, by its alias or not.
    reads: list[str] = []
    async with narrow_gateway(reads, ["docs+*"]) as url, client_with(url, NARROW) as client:
        for uri in ("sec://secret/x", "docs+sec://secret/x", PADDED, f"docs+{PADDED}"):
            with pytest.raises(MCPError, match="Resource not found"):
                await client.read_resource(uri)
    # Before: the alias of the long one was matched as docs+sec://secret/… (the match of
    # sec://secret/… given up, the URI taken as unlisted) and read.
    assert reads == []


async def test_an_alias_of_a_web_address_is_matched_as_the_alias() -> None:
    # https://* allows the pages web serves; docs+https://… is docs's, not web's.
    reads: list[str] = []
    async with narrow_gateway(reads, ["https://*"]) as url, client_with(url, NARROW) as client:
        page = await client.read_resource("https://example.org/")
        with pytest.raises(MCPError, match="Resource not found"):
            await client.read_resource("docs+https://wiki.corp/secret")
    assert isinstance(page.contents[0], types.TextResourceContents)
    assert page.contents[0].text == "page"
    # Before: matched as https://wiki.corp/secret (a link's web address is kept as it is) and read.
    assert reads == []
