"""The merged, namespaced catalog of tools, prompts, resources and templates of every upstream.

A ``CatalogSnapshot`` is immutable; ``Catalog`` holds the current one and rebuilds it from
each upstream's latest ``Listing`` whenever one changes, then tells its listeners.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import mcp_types as types
from mcp.shared.inbound import X_MCP_HEADER_KEY

from agent_gateway.catalog_parts import Listing, Part, Review, build_part, counted, unchanged
from agent_gateway.catalog_resources import (
    Matches,
    ResourceTable,
    Scan,
    TemplateEntry,
    namespace_of,
    resource_table,
    template_entries,
)
from agent_gateway.config import GatewayConfig
from agent_gateway.errors import ConfigError, InvalidArguments, ToolHeld, UnknownName
from agent_gateway.naming import NameCollision, Origin
from agent_gateway.schema_check import SchemaCheck, reason

logger = logging.getLogger(__name__)

ListName = Literal["tools", "prompts", "resources"]
"""A list a client can be told changed (``notifications/tools/list_changed``, ...)."""
ChangeListener = Callable[["CatalogChange"], Awaitable[None]]
T = TypeVar("T")


@dataclass(frozen=True)
class CatalogSnapshot:
    """One consistent view of everything the gateway offers."""

    tools: Mapping[str, Origin[types.Tool]] = field(default_factory=dict)
    listed: Mapping[str, types.Tool] = field(default_factory=dict)
    prompts: Mapping[str, Origin[types.Prompt]] = field(default_factory=dict)
    resources: Mapping[str, Origin[types.Resource]] = field(default_factory=dict)
    templates: tuple[TemplateEntry, ...] = ()
    instructions: Mapping[str, str] = field(default_factory=dict)
    version: int = 0
    parts: Mapping[str, Part] = field(default_factory=dict)
    """Each upstream's part, in configuration order."""
    held: Mapping[str, str] = field(default_factory=dict)
    """Tools withheld by pinning, with what changed: a call gets a clear refusal."""
    upstreams: frozenset[str] = frozenset()
    """Every configured upstream's name (a resource URI's namespace, ``catalog_resources``)."""
    _validators: dict[str, SchemaCheck] = field(default_factory=dict, repr=False, compare=False)
    _resources: ResourceTable = field(default_factory=ResourceTable, repr=False, compare=False)
    _headed: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)
    _matches: Matches = field(default_factory=Matches, repr=False, compare=False)

    def tool(self, name: str) -> Origin[types.Tool]:
        """Raises ``UnknownName`` when no tool has this public name."""
        if (origin := self.tools.get(name)) is None:
            if name in self.held:
                raise ToolHeld(name, self.held[name])
            raise UnknownName("tool", name)
        return origin

    def prompt(self, name: str) -> Origin[types.Prompt]:
        """Raises ``UnknownName`` when no prompt has this public name."""
        if (origin := self.prompts.get(name)) is None:
            raise UnknownName("prompt", name)
        return origin

    def resource(self, uri: str, scan: Scan | None = None) -> tuple[str, str]:
        """(upstream, upstream URI) of a public URI listed, templated or in a served namespace."""
        if (origin := self.resources.get(uri)) is not None:
            return origin.upstream, origin.name
        if (entry := self._matches.matching(self.templates, uri, self.upstreams, scan)) is not None:
            return entry.origin.upstream, entry.upstream_uri(uri)
        if (upstream := namespace_of(uri, self.upstreams)[:-1]) in self.parts:
            return upstream, uri[len(upstream) + 1 :]
        raise UnknownName("resource", uri)

    def log_ready(self, upstreams: int) -> None:
        kinds = [(self.tools, "tool"), (self.prompts, "prompt"), (self.resources, "resource")]
        served = ", ".join(
            counted(len(items), noun) for items, noun in [*kinds, (self.templates, "template")]
        )
        logger.info("catalog ready: %s from %s", served, counted(upstreams, "upstream"))

    def declares_headers(self, name: str) -> bool:
        """Whether tool ``name``'s inputSchema may annotate a property with ``x-mcp-header``:
        the modern era's ``Mcp-Param-*`` headers are checked against those only, so with none
        there is nothing to check (the text is searched once: a mention in a description
        only costs the check)."""
        if (known := self._headed.get(name)) is None:
            schema = self.tool(name).item.input_schema
            known = self._headed[name] = X_MCP_HEADER_KEY in json.dumps(schema, default=str)
        return known

    async def validate_arguments(self, name: str, arguments: dict[str, Any]) -> None:
        """Check ``arguments`` against the tool's inputSchema.

        Raises:
            UnknownName: no such tool.
            InvalidArguments: the arguments fail the schema (message from the validator).
        """
        validator = self._validators.get(name)
        if validator is None:
            validator = self._validators[name] = SchemaCheck(self.tool(name).item.input_schema)
        error = await validator.refusal(arguments)
        if error is not None:
            raise InvalidArguments(name, reason(error))


def merge(parts: Sequence[Part], version: int, previous: CatalogSnapshot | None = None) -> CatalogSnapshot:
    """One snapshot of ``parts`` (in configuration order). Validators compiled for the previous
    snapshot's tools, and resource shares, are kept for the parts that are the same object, so
    one upstream's change redoes only its own.

    Raises:
        NameCollision: two upstreams produce the same public tool or prompt name.
    """
    tools: dict[str, Origin[types.Tool]] = {}
    listed: dict[str, types.Tool] = {}
    prompts: dict[str, Origin[types.Prompt]] = {}
    held: dict[str, str] = {}
    for part in parts:
        held.update(part.held)
        _add_all("tool", tools, part.tools)
        listed.update(part.listed)
        _add_all("prompt", prompts, part.prompts)
    ordered = [(p.upstream, p.listing) for p in parts]
    names = frozenset[str]().union(*(p.upstreams for p in parts))
    resources = resource_table(parts, names, previous._resources if previous is not None else ResourceTable())
    return CatalogSnapshot(
        tools=tools,
        listed=listed,
        prompts=prompts,
        resources=resources.table,
        templates=template_entries(ordered, names, previous.templates if previous is not None else ()),
        instructions={p.upstream: p.listing.instructions for p in parts if p.listing.instructions},
        version=version,
        parts={p.upstream: p for p in parts},
        held=held,
        upstreams=names,
        _validators=_kept_validators(previous, parts),
        _resources=resources,
    )


def _add_all(kind: str, table: dict[str, Origin[T]], entries: Mapping[str, Origin[T]]) -> None:
    for public, origin in entries.items():
        if (existing := table.get(public)) is not None:
            raise NameCollision(kind, public, existing, origin)  # type: ignore[arg-type]
        table[public] = origin


def _kept_validators(previous: CatalogSnapshot | None, parts: Sequence[Part]) -> dict[str, SchemaCheck]:
    if previous is None or not previous._validators:
        return {}
    same = {p.upstream for p in parts if previous.parts.get(p.upstream) is p}
    return {name: v for name, v in previous._validators.items() if previous.tools[name].upstream in same}


def build_snapshot(
    config: GatewayConfig,
    listings: Mapping[str, Listing],
    version: int,
    reserved: frozenset[str] = frozenset(),
) -> CatalogSnapshot:
    """Merge ``listings`` (taken in config order) into one snapshot (raises ``NameCollision``:
    two upstreams produce the same public tool or prompt name)."""
    names = [n for n in config.upstreams if n in listings]
    return merge([build_part(config, n, listings[n], reserved) for n in names], version)


@dataclass(frozen=True)
class CatalogChange:
    """What one update did: the snapshots before and after, the upstreams whose part changed,
    and which lists changed (empty: nothing a client sees)."""

    before: CatalogSnapshot
    after: CatalogSnapshot
    upstreams: frozenset[str]
    lists: frozenset[ListName]


class Catalog:
    """The current snapshot; one upstream's new listing rebuilds only that upstream's part."""

    def __init__(
        self, config: GatewayConfig, reserved: frozenset[str] = frozenset(), review: Review | None = None
    ) -> None:
        """``reserved``: the public names of the gateway's own tools, which no upstream may take;
        ``review``: pinning, which may withhold changed tools."""
        self._config = config
        self._reserved = reserved
        self._review = review
        self._parts: dict[str, Part] = {}
        self._listeners: list[ChangeListener] = []
        self._early: list[Callable[[Part], None]] = []
        self._live = False
        self._refused: NameCollision | None = None
        self._hidden: dict[str, Part] = {}
        """Parts taken out while their upstream is down (``withdraw``): their names stay theirs,
        so another cannot take one meanwhile and have the first refused when it is back."""
        self.snapshot = CatalogSnapshot()
        self.problems: dict[str, str] = {}
        """Upstreams whose latest listing was refused (a collision), with the reason."""
        self._withheld: dict[str, Listing] = {}
        """Those refused listings, tried again at a reload: one the reload repaired is served
        then (its upstream lists again only when its tools change, if ever)."""

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener`` after each change, in the order of subscription."""
        self._listeners.append(listener)

    def subscribe_early(self, listener: Callable[[Part], None]) -> None:
        """Before start-up, call ``listener`` with each part as it is built (the search index's
        work overlaps connecting); a part may come again: ``start()``'s snapshot counts."""
        self._early.append(listener)

    def start(self) -> CatalogSnapshot:
        """Build the first snapshot from what connected at start-up.

        Raises:
            ConfigError: two upstreams produce the same public name.
        """
        try:
            if self._refused is not None:
                raise self._refused
            self.snapshot = merge(self._ordered(), version=1)
        except NameCollision as exc:
            raise ConfigError(f"catalog: {exc}") from None
        self._live = True
        return self.snapshot

    async def withdraw(self, upstream: str) -> None:
        """Take ``upstream``'s part out until it lists again (``failure_mode: hide``)."""
        if (part := self._parts.pop(upstream, None)) is None or not self._live:
            return
        self._hidden[upstream] = part
        self._withheld.pop(upstream, None)  # it lists again when back: a reload must not serve it
        logger.info("upstream %s is down: its part of the catalog is hidden until it is back", upstream)
        await self._publish(
            frozenset({upstream}), merge(self._ordered(), self.snapshot.version + 1, self.snapshot)
        )

    async def reconfigure(self, config: GatewayConfig, dropped: Iterable[str]) -> None:
        """Take a reloaded configuration: forget the listings of ``dropped`` upstreams (removed,
        or restarted with a new configuration), rebuild under the new names, notify.

        Raises:
            ConfigError: the new names collide; nothing was changed.
        """
        gone = set(dropped)
        kept = {n: p.listing for n, p in self._parts.items() if n not in gone and n in config.upstreams}
        hidden = {n: p.listing for n, p in self._hidden.items() if n not in gone and n in config.upstreams}
        try:
            parts = {
                n: build_part(config, n, listing, self._reserved, self._review) for n, listing in kept.items()
            }
            hid = {n: build_part(config, n, listing, self._reserved) for n, listing in hidden.items()}
            repaired, still = self._repaired(config, parts, hid, gone)
            parts |= repaired
            hid = {n: p for n, p in hid.items() if n not in repaired}  # back, listed
            ordered = [parts[n] for n in config.upstreams if n in parts]  # and what was served:
            snapshot = merge(ordered, self.snapshot.version + 1, self.snapshot)  # a URI stays its upstream's
        except NameCollision as exc:
            raise ConfigError(f"catalog: {exc}") from None
        touched = frozenset(self._parts) | frozenset(parts)
        self._config, self._parts, self._hidden = config, parts, hid
        self._withheld = {n: self._withheld[n] for n in still}
        for name in (*gone, *repaired):
            self.problems.pop(name, None)
        self.problems |= still
        if repaired:
            logger.info("reload: %s listed again: the collision is gone", ", ".join(repaired))
        await self._publish(touched, snapshot)

    async def update(self, upstream: str, listing: Listing) -> None:
        """Take ``upstream``'s new listing; after start-up, rebuild its part and notify listeners."""
        if upstream not in self._config.upstreams:
            return  # a late listing from an upstream a reload removed
        previous = self._parts.get(upstream)
        try:
            part = build_part(self._config, upstream, listing, self._reserved, self._review)
            if unchanged(previous, part) and upstream not in self.problems:
                return  # listed again unchanged (a review retried, an idle list_changed): no rebuild
            self._parts[upstream] = part
            _check_against(part, self._hidden.values())  # a name of an upstream hidden while down
            snapshot = (
                merge(self._ordered(), self.snapshot.version + 1, self.snapshot) if self._live else None
            )
        except NameCollision as exc:
            # After start-up a collision must not take down what already works: keep
            # serving the previous listing of the newcomer and report the conflict.
            self._restore(upstream, previous)
            self.problems[upstream] = str(exc)
            if self._live:
                self._withheld[upstream] = listing
                logger.error("upstream %s: catalog update refused: %s", upstream, exc)
            else:
                self._refused = exc  # start() refuses to start with it
            return
        self._hidden.pop(upstream, None)
        self._withheld.pop(upstream, None)
        self.problems.pop(upstream, None)
        if snapshot is not None:
            await self._publish(frozenset({upstream}), snapshot)
            return
        for listener in self._early:
            listener(self._parts[upstream])

    def _repaired(
        self, config: GatewayConfig, parts: Mapping[str, Part], hidden: Mapping[str, Part], gone: set[str]
    ) -> tuple[dict[str, Part], dict[str, str]]:
        """The withheld listings that no longer collide under ``config``'s names with
        ``parts`` or what is hidden, as parts; and the others, with their reason now."""
        repaired: dict[str, Part] = {}
        still: dict[str, str] = {}
        for name, listing in self._withheld.items():
            if name in gone or name not in config.upstreams:
                continue
            try:  # reviewed (pinning records what it reviews) only once it is to be served
                unreviewed = build_part(config, name, listing, self._reserved)
                _check_against(unreviewed, [*parts.values(), *repaired.values(), *hidden.values()])
            except NameCollision as exc:
                still[name] = str(exc)
            else:
                repaired[name] = build_part(config, name, listing, self._reserved, self._review)
        return repaired, still

    def _ordered(self) -> list[Part]:
        return [self._parts[n] for n in self._config.upstreams if n in self._parts]

    async def _publish(self, upstreams: frozenset[str], snapshot: CatalogSnapshot) -> None:
        before = self.snapshot
        self.snapshot = snapshot
        change = CatalogChange(before, snapshot, upstreams, _changed_lists(before, snapshot, upstreams))
        for listener in self._listeners:
            await listener(change)

    def _restore(self, upstream: str, previous: Part | None) -> None:
        if previous is None:
            self._parts.pop(upstream, None)
        else:
            self._parts[upstream] = previous


def _check_against(part: Part, others: Iterable[Part]) -> None:
    """Raises ``NameCollision`` when ``part`` takes a public name of another upstream's part."""
    for other in others:
        if other.upstream != part.upstream:
            _add_all("tool", dict(other.tools), part.tools)
            _add_all("prompt", dict(other.prompts), part.prompts)


def _changed_lists(
    old: CatalogSnapshot, new: CatalogSnapshot, upstreams: frozenset[str]
) -> frozenset[ListName]:
    """The lists that differ, comparing only the parts of ``upstreams`` (the others are shared)."""
    lists: set[ListName] = set()
    for upstream in upstreams:
        before, after = old.parts.get(upstream), new.parts.get(upstream)
        if _tools_of(before) != _tools_of(after):
            lists.add("tools")
        if _prompts_of(before) != _prompts_of(after):
            lists.add("prompts")
        if _listing(before).resources != _listing(after).resources:
            lists.add("resources")
    if _templates(old) != _templates(new):
        lists.add("resources")
    return frozenset(lists)


def _tools_of(part: Part | None) -> Mapping[str, types.Tool]:
    return part.listed if part is not None else {}


def _prompts_of(part: Part | None) -> dict[str, types.Prompt]:
    return {name: origin.item for name, origin in part.prompts.items()} if part is not None else {}


def _listing(part: Part | None) -> Listing:
    return part.listing if part is not None else Listing()


def _templates(snapshot: CatalogSnapshot) -> list[tuple[str, types.ResourceTemplate]]:
    return [(entry.public, entry.origin.item) for entry in snapshot.templates]
