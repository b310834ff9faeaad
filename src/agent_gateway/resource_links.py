"""Resource URIs in what an upstream sends back, as a client of the gateway reads them: a tool's
or a prompt's resource links and embedded resources, and the contents of a read. Each carries
the URI the catalog serves that upstream's resource by (``public_uri``): its
own where the catalog routes it to that upstream, else ``{upstream}+{uri}``. Before, a link to
a URI the upstream had not listed (a file a tool just made, a resource of a client's own
``per_client`` session) could not be read, and one to a URI two upstreams list was read from
the other."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import TypeVar

import mcp_types as types

from agent_gateway.catalog import CatalogSnapshot
from agent_gateway.errors import UnknownName

B = TypeVar("B", bound=types.ContentBlock)
C = TypeVar("C", bound=types.TextResourceContents | types.BlobResourceContents)


def linked_result(
    result: types.CallToolResult, upstream: str, snapshot: CatalogSnapshot
) -> types.CallToolResult:
    """``result`` with its blocks' resource URIs public (the same object when none changes)."""
    content = _public_blocks(result.content, upstream, snapshot)
    return result if content is None else result.model_copy(update={"content": content})


def linked_prompt(
    result: types.GetPromptResult, upstream: str, snapshot: CatalogSnapshot
) -> types.GetPromptResult:
    """``result`` with its messages' resource URIs public."""
    messages: list[types.PromptMessage] = []
    for message in result.messages:
        block = _public_blocks([message.content], upstream, snapshot)
        messages.append(message if block is None else message.model_copy(update={"content": block[0]}))
    if all(new is old for new, old in zip(messages, result.messages, strict=True)):
        return result
    return result.model_copy(update={"messages": messages})


def public_contents(
    result: types.ReadResourceResult, upstream: str, upstream_uri: str, uri: str, snapshot: CatalogSnapshot
) -> types.ReadResourceResult:
    """A read's contents under public URIs: the resource read under the URI the client read
    (``beta+shared://x``), others (a directory's children) as a link to them would be."""
    contents = [_public_contents(c, upstream, snapshot, (upstream_uri, uri)) for c in result.contents]
    if all(new is old for new, old in zip(contents, result.contents, strict=True)):
        return result
    return result.model_copy(update={"contents": contents})


def public_uri(snapshot: CatalogSnapshot, upstream: str, uri: str) -> str:
    """The URI a client reads ``upstream``'s ``uri`` by: ``uri`` where the catalog routes it
    to ``upstream``, else ``{upstream}+{uri}`` (listed as another's, or unlisted)."""
    with suppress(UnknownName):
        if snapshot.resource(uri) == (upstream, uri):
            return uri
    return f"{upstream}+{uri}"


def _public_blocks(blocks: Sequence[B], upstream: str, snapshot: CatalogSnapshot) -> list[B] | None:
    """``blocks`` with resource URIs public, or None when none changes (most results hold no
    resource: one look at each block's type)."""
    if not any(block.type == "resource_link" or block.type == "resource" for block in blocks):
        return None
    public: list[B] = []
    for block in blocks:
        if isinstance(block, types.ResourceLink):
            uri = public_uri(snapshot, upstream, block.uri)
            block = block if uri == block.uri else block.model_copy(update={"uri": uri})
        elif isinstance(block, types.EmbeddedResource):
            contents = _public_contents(block.resource, upstream, snapshot)
            block = block if contents is block.resource else block.model_copy(update={"resource": contents})
        public.append(block)  # pyright: ignore[reportArgumentType]
    return None if all(new is old for new, old in zip(public, blocks, strict=True)) else public


def _public_contents(
    contents: C, upstream: str, snapshot: CatalogSnapshot, read: tuple[str, str] = ("", "")
) -> C:
    """``contents`` under its public URI (``read``: the upstream URI read and the URI the
    client read it by, which is its public URI)."""
    uri = read[1] if contents.uri == read[0] else public_uri(snapshot, upstream, contents.uri)
    return contents if uri == contents.uri else contents.model_copy(update={"uri": uri})
