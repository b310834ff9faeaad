"""What the model reads of a tool's result, or of a resource it read (``read_resource``), and
the resource links a result gives: kept beside the text (a ``ToolMessage``'s ``artifact``,
stored with it in the thread), never read back out of it, where an upstream's own words could
write one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import mcp_types as types
from langchain_core.messages import AnyMessage, ToolMessage

MAX_RESULT_CHARS = 100_000
"""A tool result longer than this reaches the model cut, with a note saying so."""
LINKS = "links"
"""The key of a ``ToolMessage``'s artifact that holds the URIs its result linked to."""
FROM = "upstream"
"""The key of the artifact that names the upstream whose result gave those links."""


def render(result: types.CallToolResult) -> str:
    """A tool result as text for the model: text blocks as they are, other blocks described."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False, default=str)]
    return cut("\n".join(parts) if parts else "(no content)")


def read_text(read: types.ReadResourceResult) -> str:
    """A resource read as text for the model: each content's text (under its URI when there
    are several), binary ones described."""
    named = len(read.contents) > 1
    return cut("\n".join(_contents_text(contents, named) for contents in read.contents))


def links_of(result: types.CallToolResult) -> list[str]:
    """The URIs ``result``'s resource links give (public ones: the proxy made them so)."""
    return [block.uri for block in result.content if isinstance(block, types.ResourceLink)]


def artifact(
    links: Sequence[str], upstream: str = "", chars: int = MAX_RESULT_CHARS
) -> dict[str, str | list[str]] | None:
    """What a ``ToolMessage`` keeps beside its text: the links its result gave, if any, as
    many as fit ``chars`` (the model reads no more of the result, and the thread keeps what
    is here), and the ``upstream`` that gave them."""
    kept, size = [], 0
    for uri in links:
        if (size := size + len(uri)) > chars:
            break
        kept.append(uri)
    return {LINKS: kept, FROM: upstream} if kept else None


def cut_links(kept: object, chars: int) -> object:
    """An artifact (``kept``) of a result whose text was cut to ``chars`` characters, its
    links cut alike: cut to a note by the turn's bound (``turn_bound.fitted``), 32 results
    each kept 100,000 characters of links in the thread, 3.2 MB a step, written at each."""
    if not isinstance(kept, dict):
        return kept
    held: dict[str, object] = kept  # pyright: ignore[reportUnknownVariableType]
    links, upstream = held.get(LINKS), held.get(FROM)
    if not isinstance(links, list) or not isinstance(upstream, str):
        return None
    return artifact([uri for uri in links if isinstance(uri, str)], upstream, chars)  # pyright: ignore[reportUnknownVariableType]


Linked = Mapping[str, frozenset[str]]
"""Each URI a result linked to, and the upstreams whose results did."""


def linked(messages: Iterable[AnyMessage]) -> Linked:
    """Every URI a tool result among ``messages`` linked to, with the upstreams that gave it:
    the model is offered ``read_resource`` once there is one, and may read those, each from
    an upstream that linked to it. A web address is kept as it is (``resource_links.WEB``),
    and the catalog may serve it as another upstream's: one upstream's link must not read
    that (its words would choose it, and the model pass it on)."""
    found: dict[str, set[str]] = {}
    for message in messages:
        if isinstance(message, ToolMessage) and isinstance(message.artifact, dict):
            kept: dict[str, object] = message.artifact  # pyright: ignore[reportUnknownMemberType]
            uris, upstream = kept.get(LINKS), kept.get(FROM)
            if isinstance(uris, list) and isinstance(upstream, str) and upstream:
                for uri in uris:  # pyright: ignore[reportUnknownVariableType]
                    if isinstance(uri, str):
                        found.setdefault(uri, set()).add(upstream)
    return {uri: frozenset(upstreams) for uri, upstreams in found.items()}


def cut(text: str) -> str:
    """``text`` as the model gets it: at most ``MAX_RESULT_CHARS``, saying how much more there was."""
    if len(text) > MAX_RESULT_CHARS:
        over = len(text) - MAX_RESULT_CHARS
        text = f"{text[:MAX_RESULT_CHARS]}\n[… {over} more characters cut by the gateway]"
    return text


def _contents_text(contents: types.TextResourceContents | types.BlobResourceContents, named: bool) -> str:
    if isinstance(contents, types.BlobResourceContents):
        kind = contents.mime_type or "unknown type"
        return f"[binary resource {contents.uri}, {kind}, {len(contents.blob)} bytes of base64]"
    return f"[{contents.uri}]\n{contents.text}" if named else contents.text


def _block_text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type} content, {block.mime_type}, {len(block.data)} bytes of base64]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    resource = block.resource
    if isinstance(resource, types.TextResourceContents):
        return resource.text
    return f"[binary resource {resource.uri}, {resource.mime_type or 'unknown type'}]"
