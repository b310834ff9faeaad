"""One upstream's share of the catalog (a ``Part``): its tools and prompts under their public
names, after selection, renames, the gateway's reserved names and pinning's review. Built
once per listing an upstream sends, so a change of one upstream rebuilds only its part."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, TypeVar

import mcp_types as types
import msgspec
from pydantic import AnyUrl

from agent_gateway.config import GatewayConfig, UpstreamConfig
from agent_gateway.errors import shown
from agent_gateway.naming import Origin, is_selected, public_name

logger = logging.getLogger("agent_gateway.catalog")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Listing:
    """Everything an upstream offers, as it last told us."""

    tools: tuple[types.Tool, ...] = ()
    prompts: tuple[types.Prompt, ...] = ()
    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    instructions: str | None = None
    protocol_version: str = ""


@dataclass(frozen=True, eq=False)
class Part:
    """One upstream's share of the catalog: its tools and prompts under their public names.

    Built once per listing the upstream sends; a change of one upstream builds only its part,
    and the other parts (and whatever was derived from them) are reused as they are.
    """

    upstream: str
    listing: Listing
    tools: Mapping[str, Origin[types.Tool]] = field(default_factory=dict)
    listed: Mapping[str, types.Tool] = field(default_factory=dict)
    """The tools as clients see them: the upstream's definitions under their public names."""
    prompts: Mapping[str, Origin[types.Prompt]] = field(default_factory=dict)
    held: Mapping[str, str] = field(default_factory=dict)
    """Tools withheld by pinning (public name to what changed)."""
    sizes: Mapping[str, int] = field(default_factory=dict)
    """About the bytes of each listed tool's definition (``size_of``): what a page costs."""
    renamed: Mapping[str, str] = field(default_factory=dict)
    """The name ``rename`` gave a tool, by public name (the search index reads both names)."""
    search_weight: float = 1.0
    """Its upstream's ``search_weight``: what tool search makes of its tools' matches."""
    upstreams: frozenset[str] = frozenset()
    """Every configured upstream's name: ``{name}+`` begins its qualified resource URIs."""

    @cached_property
    def spellings(self) -> Mapping[str, str]:
        """Each resource URI it lists, by its ``spelling``: worked out once per listing (about
        2 us a URI), not at every other upstream's change."""
        return {str(r.uri): spelling(str(r.uri)) for r in self.listing.resources}


def spelling(uri: str) -> str:
    """``uri`` as a client is listed it and reads it: FastMCP lists resources as URLs, which
    lower-case the scheme and host, drop a default port and resolve dot segments
    (``file:///x/../doc`` is ``file:///doc``). A URI that is no URL is not listed."""
    try:
        return str(AnyUrl(uri))
    except ValueError:
        return uri


def unchanged(before: Part | None, after: Part) -> bool:
    """Whether ``after`` serves what ``before`` did: the same listing, the same tools withheld
    (rebuilt from the same configuration)."""
    return before is not None and before.listing == after.listing and before.held == after.held


Review = Callable[[str, str, Mapping[str, types.Tool]], dict[str, str]]
"""Pinning's review of one upstream's tools: (upstream, its source, tools) to those withheld."""


def build_part(
    config: GatewayConfig,
    upstream: str,
    listing: Listing,
    reserved: frozenset[str] = frozenset(),
    review: Review | None = None,
) -> Part:
    """``upstream``'s share of the catalog: its tools and prompts under their public names,
    minus tools whose public name is one of the gateway's own (``reserved``), minus tools of an
    upstream without a prefix named in another's namespace, minus those ``review`` withholds
    (pinning), minus a second tool or prompt taking a public name the upstream already gave
    (``a.b`` and ``a_b``: the first is served, the other skipped)."""
    up = config.upstreams[upstream]
    sep = config.server.separator
    others = _namespaces(config, upstream)
    entries = [
        e
        for e in _tool_entries(upstream, listing, up, sep)
        if not _reserved(reserved, *e) and not _unlistable(*e) and not _intruding(others, *e)
    ]
    tools = _first_of_each("tool", entries)
    listed = {public: origin.item.model_copy(update={"name": public}) for public, origin in tools.items()}
    held = review(upstream, source_of(up), listed) if review is not None else {}
    if held:
        tools = {n: o for n, o in tools.items() if n not in held}
        listed = {n: t for n, t in listed.items() if n not in held}
    prompts = _first_of_each("prompt", _prompt_entries(upstream, listing, up, sep))
    sizes = {name: size_of(tool) for name, tool in listed.items()}
    renamed = {public: up.rename[o.name] for public, o in tools.items() if o.name in up.rename}
    names = frozenset(config.upstreams)
    return Part(upstream, listing, tools, listed, prompts, held, sizes, renamed, up.search_weight, names)


def size_of(tool: types.Tool) -> int:
    """About the bytes of ``tool``'s definition in a listing: its schemas as compact JSON, and
    the rest (words, ``_meta``, icons, annotations: up to ``MAX_ITEM_BYTES``) as served."""
    schemas = len(msgspec.json.encode(tool.input_schema))
    if tool.output_schema is not None:
        schemas += len(msgspec.json.encode(tool.output_schema))
    return schemas + rest_size(tool)


class Listed(Protocol):
    """What every listed item has (a tool, prompt, resource or template)."""

    name: str

    def model_dump_json(self, *, by_alias: bool, exclude_none: bool, exclude: set[str]) -> str: ...


def rest_size(item: Listed) -> int:
    """The bytes of a listed item's JSON but a tool's schemas (bounded apart, ``MAX_SCHEMA_BYTES``):
    its name, title, description, ``_meta``, icons, annotations, a prompt's arguments."""
    return len(item.model_dump_json(by_alias=True, exclude_none=True, exclude=_SCHEMAS))


_SCHEMAS = {"input_schema", "output_schema"}


def _first_of_each(kind: str, entries: list[tuple[str, Origin[T]]]) -> dict[str, Origin[T]]:
    table: dict[str, Origin[T]] = {}
    skipped: list[tuple[str, Origin[T]]] = []
    for public, origin in entries:
        if public in table:
            skipped.append((public, origin))
        else:
            table[public] = origin
    if skipped:  # one line per listing: the upstream chooses how many it repeats
        public, origin = skipped[0]
        logger.warning(
            "upstream %s: %d %ss skipped: their public names are already given (%s: %r is already %s's); "
            "rename one of each",
            origin.upstream,
            len(skipped),
            kind,
            shown(origin.name),
            public,
            shown(table[public].name),
        )
    return table


def _namespaces(config: GatewayConfig, upstream: str) -> tuple[str, ...]:
    """The namespaces (``memory__``) of the other prefixed upstreams, when ``upstream`` has no
    prefix of its own: the names in them that it may not take."""
    if config.upstreams[upstream].prefix:
        return ()
    sep = config.server.separator
    return tuple(f"{name}{sep}" for name, up in config.upstreams.items() if up.prefix and name != upstream)


def _intruding(namespaces: tuple[str, ...], public: str, origin: Origin[types.Tool]) -> bool:
    """Whether a tool of an upstream without a prefix is named in another upstream's namespace:
    policies, pins and approvals written as ``memory__*`` would take it for ``memory``'s."""
    if not public.startswith(namespaces):
        return False
    logger.warning(
        "upstream %s: tool %s is hidden: its public name %r is in another upstream's namespace "
        "(give it a 'rename', or turn 'prefix' on)",
        origin.upstream,
        shown(origin.name),
        public,
    )
    return True


def _reserved(reserved: frozenset[str], public: str, origin: Origin[types.Tool]) -> bool:
    """Whether an upstream tool would take the name of one of the gateway's own tools."""
    if public not in reserved:
        return False
    logger.warning(
        "upstream %s: tool %r is hidden: its public name %r is one of the gateway's own tools "
        "(rename it, or rename the gateway's tool: agent.name)",
        origin.upstream,
        origin.name,
        public,
    )
    return True


MAX_INSTRUCTIONS = 8192
"""The characters of an upstream's ``instructions`` kept (real ones are a few hundred to a few
thousand). They go into every client's handshake, the search index and the agent's prompt:
an upstream's 2 MiB of them made every handshake-era client's ``initialize`` answer larger
than the SDK client reads (1 MiB), so no such client could connect, whichever upstreams it
used; 50 MiB held 0.5 GB of the gateway's memory."""


def kept_instructions(text: str | None, upstream: str) -> str | None:
    """``upstream``'s instructions as the catalog keeps them: at most ``MAX_INSTRUCTIONS``
    characters, the cut said in the text and in one WARNING."""
    if text is None or len(text) <= MAX_INSTRUCTIONS:
        return text
    logger.warning(
        "%s's instructions are %d characters long: the first %d kept", upstream, len(text), MAX_INSTRUCTIONS
    )
    return f"{text[:MAX_INSTRUCTIONS]}... (cut: {len(text)} characters)"


MAX_LISTED = 10_000
"""Items of one kind (tools, prompts, resources, templates) one upstream may list; the largest
real servers list a few hundred. A listing of 60,000 tools (120 MB) was read and kept whole."""
MAX_LISTED_BYTES = 64 * 2**20
"""What one upstream's list of one kind may hold: its items' JSON (names, titles, descriptions,
``_meta``, a prompt's arguments: ``MAX_ITEM_BYTES`` each) and its tools' schemas (each schema is
bounded too, 1 MiB: ``MAX_SCHEMA_BYTES``; 10,000 tools at that bound would be 10 GiB)."""
MAX_ITEM_BYTES = 2**20
"""What one listed tool, prompt, resource or template may hold besides a tool's schemas, as
JSON: its name, title, description, ``_meta``, icons, annotations, a prompt's arguments (the
longest description of the benchmark's 2,815 real tools is 6.5 KB). Larger, it is not listed:
before, only ``MAX_LISTED_BYTES`` and the message size bounded it, and every client's listing
page holding it carried it (a tool of a 60 MB description: 60 MB a client's ``tools/list``)."""
MAX_SCHEMA_BYTES = 2**20
"""How large one of a tool's schemas may be, serialised (most real ones are a few KB; the
largest of the benchmark's 2,815 real tools, Microsoft 365's ``create-sharepoint-list-item``,
is 268 KB as FastMCP serves it). Larger, the tool is not listed: otherwise only the upstream's
message size (128 MiB) bounded it, and every client's listing page holding the tool carried
it, and every search result naming it."""
MAX_SCHEMA_DEPTH = 100
"""How deep a tool's schemas may nest (objects and arrays). Deeper, the tool is not listed:
no client could read a page holding it (pydantic serialises at most 255 levels and its JSON
parser, in clients, reads about 200), so one such tool would fail every client's listing."""


def _unlistable(public: str, origin: Origin[types.Tool]) -> bool:
    """Whether an upstream tool's schemas nest deeper than ``MAX_SCHEMA_DEPTH`` or are larger
    than ``MAX_SCHEMA_BYTES`` (said once)."""
    tool = origin.item
    for schema in (tool.input_schema, tool.output_schema):
        why = _schema_fault(schema) if schema is not None else None
        if why is not None:
            logger.warning(
                "upstream %s: tool %s is not listed: its schema %s", origin.upstream, shown(origin.name), why
            )
            return True
    return False


def _schema_fault(schema: Mapping[str, object]) -> str | None:
    """What keeps ``schema`` from any listing, or None."""
    try:
        encoded = msgspec.json.encode(schema)
    except RecursionError:  # deeper than the encoder goes: far deeper than the bound
        return f"nests deeper than {MAX_SCHEMA_DEPTH} levels"
    if len(encoded) > MAX_SCHEMA_BYTES:
        return f"is {len(encoded):,} bytes, more than {MAX_SCHEMA_BYTES:,}"
    if _nests_deeper(schema, encoded, MAX_SCHEMA_DEPTH):
        return f"nests deeper than {MAX_SCHEMA_DEPTH} levels"
    return None


def _nests_deeper(schema: Mapping[str, object], encoded: bytes, bound: int) -> bool:
    # Counted without recursion (a schema thousands deep must not exhaust the stack), and
    # walked only when it has more brackets than the bound: real schemas have far fewer.
    if encoded.count(b"{") + encoded.count(b"[") <= bound:
        return False
    stack: list[tuple[object, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > bound:
            return True
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return False


def _tool_entries(
    upstream: str, listing: Listing, config: UpstreamConfig, sep: str
) -> list[tuple[str, Origin[types.Tool]]]:
    entries: list[tuple[str, Origin[types.Tool]]] = []
    for tool in listing.tools:
        if not is_selected(tool.name, config.include, config.exclude):
            continue
        shown = config.rename.get(tool.name, tool.name)
        public = public_name(upstream, shown, prefix=config.prefix, separator=sep)
        entries.append((public, Origin(upstream, tool.name, tool)))
    return entries


def _prompt_entries(
    upstream: str, listing: Listing, config: UpstreamConfig, sep: str
) -> list[tuple[str, Origin[types.Prompt]]]:
    return [
        (
            public_name(upstream, config.rename.get(p.name, p.name), prefix=config.prefix, separator=sep),
            Origin(upstream, p.name, p),
        )
        for p in listing.prompts
    ]


def served_counts(listing: Listing, config: UpstreamConfig) -> str:
    """What a listing serves, as the upstream's ready line says it: its tools after the
    upstream's ``include``/``exclude`` (and how many those left out), then its prompts,
    resources and templates, each counted apart (``2 tools (1 excluded), 1 prompt, …``)."""
    served = sum(is_selected(t.name, config.include, config.exclude) for t in listing.tools)
    left_out = len(listing.tools) - served
    tools = counted(served, "tool") + (f" ({left_out} excluded)" if left_out else "")
    rest = [(listing.prompts, "prompt"), (listing.resources, "resource"), (listing.templates, "template")]
    return ", ".join([tools, *(counted(len(items), noun) for items, noun in rest)])


def counted(n: int, noun: str) -> str:
    """``1 tool``, ``2 tools``: for log lines."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def source_of(config: UpstreamConfig) -> str:
    """The upstream as configured: what it runs or where it is (not its headers or env): what
    its tools are pinned under (``pins.py``), so the same tools from elsewhere are not trusted."""
    where = [config.command or "", *config.args, config.url or "", config.cwd or ""]
    return hashlib.sha256("\0".join(where).encode()).hexdigest()[:32]
