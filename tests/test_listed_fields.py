"""Prompts, resources and templates are listed as their upstream listed them, in both eras:
every field kept (a resource's ``size``, ``_meta``, an argument that says nothing of
``required``), none made up (no MIME type where the upstream knew none), only the name or
URI made public."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server

from tests.support import running_gateway, serving

ICONS = [{"src": "https://example.com/i.png", "mimeType": "image/png", "sizes": ["16x16"]}]
NOTES = {"audience": ["user"], "priority": 0.5, "lastModified": "2025-01-02T03:04:05Z"}
META = {"example.com/k": {"v": 1}}
FULL = {"title": "F", "description": "d", "icons": ICONS, "_meta": META}
# As the upstream sends them: the second argument says nothing of ``required``, the first
# resource and template no MIME type.
PROMPTS = [{"name": "p", **FULL, "arguments": [{"name": "a", "title": "A", "required": True}, {"name": "b"}]}]
RESOURCES = [
    {"uri": "file:///bare", "name": "bare"},
    {
        "uri": "file:///full.json",
        "name": "full",
        "mimeType": "application/json",
        "size": 1234,
        "annotations": NOTES,
    }
    | FULL,
]
TEMPLATES = [
    {"uriTemplate": "file:///t/{name}", "name": "bare"},
    {
        "uriTemplate": "file:///j/{name}.json",
        "name": "full",
        "mimeType": "application/json",
        "annotations": NOTES,
    }
    | FULL,
]


def listing_server() -> Server:
    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult.model_validate({"prompts": PROMPTS})

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult.model_validate({"resources": RESOURCES})

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": TEMPLATES})

    return Server(
        "lister",
        on_list_prompts=list_prompts,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
    )


def fields(items: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(by_alias=True, exclude_none=True, mode="json") for item in items]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_prompts_resources_and_templates_are_listed_as_their_upstream_listed_them(mode: str) -> None:
    async with (
        serving(listing_server().streamable_http_app()) as base,
        running_gateway({"upstreams": {"up": {"url": f"{base}/mcp"}}, "agent": {"enabled": False}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        prompts = (await client.list_prompts()).prompts
        resources = (await client.list_resources()).resources
        templates = (await client.list_resource_templates()).resource_templates
    assert fields(prompts) == [PROMPTS[0] | {"name": "up__p"}]
    assert fields(resources) == RESOURCES  # one upstream: its URIs are its own
    assert fields(templates) == TEMPLATES
