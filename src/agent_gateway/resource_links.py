"""Resource URIs in what an upstream sends back, as a client of the gateway reads them: a tool's
or a prompt's resource links and embedded resources, and the contents of a read. Each carries
the URI the catalog serves that upstream's resource by (``public_uri``): its
own where the catalog routes it to that upstream, else ``{upstream}+{uri}``. Before, a link to
a URI the upstream had not listed (a file a tool just made, a resource of a client's own
``per_client`` session) could not be read, and one to a URI two upstreams list was read from
the other."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import suppress
from typing import TypeVar

import mcp_types as types

from agent_gateway.catalog import CatalogSnapshot
from agent_gateway.catalog_resources import Scan, Unscanned
from agent_gateway.errors import UnknownName

logger = logging.getLogger(__name__)

WEB = ("http://", "https://", "data:")
"""URIs that name the same thing whoever reads them: kept as they are (a client may open a
web address itself; ``vault+https://…`` is none)."""

LOOKUPS = 20_000
"""Templates one answer's resource URIs may be matched against, all told (about 6 ms of the
event loop): past that, an upstream's answer of many links against many templates (300,000
links fit its bound on a message: minutes at 10,000 templates) has its URIs that the catalog
does not list as its own qualified unmatched, which stays readable (``{upstream}+…`` always
reaches that upstream)."""

SCANNED = 65_536
"""Characters the template matchers may scan for one answer's URIs, all told (a matcher's
scan is Python, 0.06-0.15 us a character: 4-10 ms). ``LOOKUPS`` counts tries, not their
length: an upstream listing templates with no literal text (``{v0}``, ``{v1}``…, which every
URI may match) answered a 60 KB link that took 3.7 s of the event loop at 1,000 of them.
Past it, as past ``LOOKUPS``, the answer's other URIs are qualified unmatched."""

B = TypeVar("B", bound=types.ContentBlock)
C = TypeVar("C", bound=types.TextResourceContents | types.BlobResourceContents)


def linked_result(
    result: types.CallToolResult, upstream: str, snapshot: CatalogSnapshot
) -> types.CallToolResult:
    """``result`` with its blocks' resource URIs public (the same object when none changes)."""
    matched = _scan(len(result.content), snapshot)
    content = _public_blocks(result.content, upstream, snapshot, matched)
    return result if content is None else result.model_copy(update={"content": content})


def linked_prompt(
    result: types.GetPromptResult, upstream: str, snapshot: CatalogSnapshot
) -> types.GetPromptResult:
    """``result`` with its messages' resource URIs public."""
    matched = _scan(len(result.messages), snapshot)
    messages: list[types.PromptMessage] = []
    for message in result.messages:
        block = _public_blocks([message.content], upstream, snapshot, matched)
        messages.append(message if block is None else message.model_copy(update={"content": block[0]}))
    if all(new is old for new, old in zip(messages, result.messages, strict=True)):
        return result
    return result.model_copy(update={"messages": messages})


def public_contents(
    result: types.ReadResourceResult, upstream: str, upstream_uri: str, uri: str, snapshot: CatalogSnapshot
) -> types.ReadResourceResult:
    """A read's contents under public URIs: the resource read under the URI the client read
    (``beta+shared://x``), others (a directory's children) as a link to them would be."""
    matched = _scan(len(result.contents), snapshot)
    contents = [
        _public_contents(c, upstream, snapshot, matched, (upstream_uri, uri)) for c in result.contents
    ]
    if all(new is old for new, old in zip(contents, result.contents, strict=True)):
        return result
    return result.model_copy(update={"contents": contents})


def public_uri(snapshot: CatalogSnapshot, upstream: str, uri: str, matched: bool | Scan = True) -> str:
    """The URI a client reads ``upstream``'s ``uri`` by: ``uri`` where the catalog routes it
    to ``upstream``, or where it is a web address (``WEB``), else ``{upstream}+{uri}`` (listed
    as another's, or unlisted). Not ``matched``: ``uri`` only where the catalog lists it as
    ``upstream``'s or it is a web address (no template tried); a ``Scan``: templates tried
    while it lasts, then as not matched."""
    if uri[:8].lower().startswith(WEB):
        return uri
    if matched is not False:
        with suppress(UnknownName, Unscanned):
            routed = snapshot.resource(uri, matched if isinstance(matched, Scan) else None)
            return uri if routed == (upstream, uri) else f"{upstream}+{uri}"
    listed = snapshot.resources.get(uri)
    own = listed is not None and (listed.upstream, listed.name) == (upstream, uri)
    return uri if own else f"{upstream}+{uri}"


def _scan(count: int, snapshot: CatalogSnapshot) -> Scan | bool:
    """How an answer of ``count`` URIs is matched: against the templates within ``SCANNED``
    characters, or (past ``LOOKUPS`` tries) not at all."""
    if count * len(snapshot.templates) <= LOOKUPS:
        return Scan(SCANNED)
    logger.debug(
        "an answer of %d URIs against %d templates: made public unmatched", count, len(snapshot.templates)
    )
    return False


def _public_blocks(
    blocks: Sequence[B], upstream: str, snapshot: CatalogSnapshot, matched: bool | Scan
) -> list[B] | None:
    """``blocks`` with resource URIs public, or None when none changes (most results hold no
    resource: one look at each block's type)."""
    if not any(block.type == "resource_link" or block.type == "resource" for block in blocks):
        return None
    public: list[B] = []
    for block in blocks:
        if isinstance(block, types.ResourceLink):
            uri = public_uri(snapshot, upstream, block.uri, matched)
            block = block if uri == block.uri else block.model_copy(update={"uri": uri})
        elif isinstance(block, types.EmbeddedResource):
            contents = _public_contents(block.resource, upstream, snapshot, matched)
            block = block if contents is block.resource else block.model_copy(update={"resource": contents})
        public.append(block)  # pyright: ignore[reportArgumentType]
    return None if all(new is old for new, old in zip(public, blocks, strict=True)) else public


def _public_contents(
    contents: C,
    upstream: str,
    snapshot: CatalogSnapshot,
    matched: bool | Scan,
    read: tuple[str, str] = ("", ""),
) -> C:
    """``contents`` under its public URI (``read``: the upstream URI read and the URI the
    client read it by, which is its public URI)."""
    uri = read[1] if contents.uri == read[0] else public_uri(snapshot, upstream, contents.uri, matched)
    return contents if uri == contents.uri else contents.model_copy(update={"uri": uri})
