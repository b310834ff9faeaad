"""The merged, namespaced catalog of tools, prompts, resources and templates of every upstream.

A ``CatalogSnapshot`` is immutable; ``Catalog`` holds the current one and rebuilds it from
each upstream's latest ``Listing`` whenever one changes, then tells its listeners.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp_types as types
from jsonschema import validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from agent_gateway.config import GatewayConfig, UpstreamConfig
from agent_gateway.errors import ConfigError, InvalidArguments, UnknownName
from agent_gateway.naming import NameCollision, Origin, build_table, is_selected, public_name
from agent_gateway.upstreams.connection import Listing

logger = logging.getLogger(__name__)

Kind = Literal["tools", "prompts", "resources"]
ChangeListener = Callable[[frozenset[Kind]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TemplateEntry:
    """A public resource template and how to turn a matching URI into the upstream's URI."""

    public: str
    origin: Origin[types.ResourceTemplate]
    matcher: UriTemplate
    prefix: str

    def upstream_uri(self, uri: str) -> str:
        return uri[len(self.prefix) :]


@dataclass(frozen=True)
class CatalogSnapshot:
    """One consistent view of everything the gateway offers."""

    tools: Mapping[str, Origin[types.Tool]] = field(default_factory=dict)
    prompts: Mapping[str, Origin[types.Prompt]] = field(default_factory=dict)
    resources: Mapping[str, Origin[types.Resource]] = field(default_factory=dict)
    templates: tuple[TemplateEntry, ...] = ()
    instructions: Mapping[str, str] = field(default_factory=dict)
    version: int = 0
    _validators: dict[str, Validator] = field(default_factory=dict, repr=False, compare=False)

    def tool(self, name: str) -> Origin[types.Tool]:
        """Raises ``UnknownName`` when no tool has this public name."""
        if (origin := self.tools.get(name)) is None:
            raise UnknownName("tool", name)
        return origin

    def prompt(self, name: str) -> Origin[types.Prompt]:
        """Raises ``UnknownName`` when no prompt has this public name."""
        if (origin := self.prompts.get(name)) is None:
            raise UnknownName("prompt", name)
        return origin

    def resource(self, uri: str) -> tuple[str, str]:
        """(upstream, upstream URI) for a public URI, listed or matching a template.

        Raises:
            UnknownName: no listed resource or template matches ``uri``.
        """
        if (origin := self.resources.get(uri)) is not None:
            return origin.upstream, origin.name
        for entry in self.templates:
            if uri.startswith(entry.prefix) and entry.matcher.match(uri) is not None:
                return entry.origin.upstream, entry.upstream_uri(uri)
        raise UnknownName("resource", uri)

    def validate_arguments(self, name: str, arguments: dict[str, Any]) -> None:
        """Check ``arguments`` against the tool's inputSchema.

        Raises:
            UnknownName: no such tool.
            InvalidArguments: the arguments fail the schema (message from the validator).
        """
        validator = self._validators.get(name)
        if validator is None:
            validator = self._validators[name] = _compile(self.tool(name).item.input_schema)
        error = next(iter(validator.iter_errors(arguments)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise InvalidArguments(name, f"{where}: {error.message}" if where else error.message)


def _compile(schema: dict[str, Any]) -> Validator:
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError:
        # The upstream's own schema is broken: let the upstream judge its arguments.
        return validators.Draft202012Validator({})
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def build_snapshot(config: GatewayConfig, listings: Mapping[str, Listing], version: int) -> CatalogSnapshot:
    """Merge ``listings`` (taken in config order) into one snapshot.

    Raises:
        NameCollision: two upstreams produce the same public tool or prompt name.
    """
    ordered = [(n, listings[n], config.upstreams[n]) for n in config.upstreams if n in listings]
    sep = config.server.separator
    entries = [e for n, li, up in ordered for e in _tool_entries(n, li, up, sep)]
    tools = build_table("tool", [e for e in entries if not _reserved(config, *e)])
    prompts = build_table("prompt", [e for n, li, up in ordered for e in _prompt_entries(n, li, up, sep)])
    return CatalogSnapshot(
        tools=tools,
        prompts=prompts,
        resources=_resource_table(ordered),
        templates=_template_entries(ordered),
        instructions={n: li.instructions for n, li, _ in ordered if li.instructions},
        version=version,
    )


def _reserved(config: GatewayConfig, public: str, origin: Origin[types.Tool]) -> bool:
    """Whether an upstream tool would take the name of the gateway's own ``ask_agent``."""
    if not (config.agent.enabled and public == config.agent.name):
        return False
    logger.warning(
        "upstream %s: tool %r is hidden: its public name %r is the gateway's own agent tool "
        "(rename it, or set agent.name)",
        origin.upstream,
        origin.name,
        public,
    )
    return True


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


def _resource_table(ordered: list[tuple[str, Listing, UpstreamConfig]]) -> dict[str, Origin[types.Resource]]:
    owners: dict[str, int] = {}
    for _, listing, _ in ordered:
        for uri in {str(r.uri) for r in listing.resources}:
            owners[uri] = owners.get(uri, 0) + 1
    table: dict[str, Origin[types.Resource]] = {}
    for upstream, listing, _ in ordered:
        for resource in listing.resources:
            uri = str(resource.uri)
            # A URI two upstreams share is qualified with the upstream's name, never dropped.
            public = uri if owners[uri] == 1 else f"{upstream}+{uri}"
            table[public] = Origin(upstream, uri, resource)
    return table


def _template_entries(ordered: list[tuple[str, Listing, UpstreamConfig]]) -> tuple[TemplateEntry, ...]:
    counts: dict[str, int] = {}
    for _, listing, _ in ordered:
        for template in listing.templates:
            counts[template.uri_template] = counts.get(template.uri_template, 0) + 1
    entries: list[TemplateEntry] = []
    for upstream, listing, _ in ordered:
        for template in listing.templates:
            prefix = "" if counts[template.uri_template] == 1 else f"{upstream}+"
            public = prefix + template.uri_template
            try:
                matcher = UriTemplate.parse(public)
            except InvalidUriTemplate:
                logger.warning(
                    "upstream %s: skipping invalid URI template %r", upstream, template.uri_template
                )
                continue
            entries.append(
                TemplateEntry(public, Origin(upstream, template.uri_template, template), matcher, prefix)
            )
    return tuple(entries)


class Catalog:
    """The current snapshot, rebuilt when an upstream's listing changes."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._listings: dict[str, Listing] = {}
        self._listeners: list[ChangeListener] = []
        self._live = False
        self.snapshot = CatalogSnapshot()
        self.problems: dict[str, str] = {}
        """Upstreams whose latest listing was refused (a collision), with the reason."""

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def start(self) -> CatalogSnapshot:
        """Build the first snapshot from what connected at start-up.

        Raises:
            ConfigError: two upstreams produce the same public name.
        """
        try:
            self.snapshot = build_snapshot(self._config, self._listings, version=1)
        except NameCollision as exc:
            raise ConfigError(f"catalog: {exc}") from None
        self._live = True
        return self.snapshot

    async def withdraw(self, upstream: str) -> None:
        """Take ``upstream``'s part out until it lists again (``failure_mode: hide``)."""
        if self._listings.pop(upstream, None) is None or not self._live:
            return
        logger.info("upstream %s is down: its part of the catalog is hidden until it is back", upstream)
        await self._publish(build_snapshot(self._config, self._listings, self.snapshot.version + 1))

    async def reconfigure(self, config: GatewayConfig, dropped: Iterable[str]) -> None:
        """Take a reloaded configuration: forget the listings of ``dropped`` upstreams (removed,
        or restarted with a new configuration), rebuild under the new names, notify.

        Raises:
            ConfigError: the new names collide; nothing was changed.
        """
        gone = set(dropped)
        listings = {n: li for n, li in self._listings.items() if n not in gone and n in config.upstreams}
        try:
            snapshot = build_snapshot(config, listings, self.snapshot.version + 1)
        except NameCollision as exc:
            raise ConfigError(f"catalog: {exc}") from None
        self._config, self._listings = config, listings
        for name in gone:
            self.problems.pop(name, None)
        await self._publish(snapshot)

    async def update(self, upstream: str, listing: Listing) -> None:
        """Take ``upstream``'s new listing; after start-up, rebuild and notify listeners."""
        if upstream not in self._config.upstreams:
            return  # a late listing from an upstream a reload removed
        previous = self._listings.get(upstream)
        self._listings[upstream] = listing
        if not self._live:
            return
        try:
            snapshot = build_snapshot(self._config, self._listings, self.snapshot.version + 1)
        except NameCollision as exc:
            # After start-up a collision must not take down what already works: keep
            # serving the previous listing of the newcomer and report the conflict.
            self._restore(upstream, previous)
            self.problems[upstream] = str(exc)
            logger.error("upstream %s: catalog update refused: %s", upstream, exc)
            return
        self.problems.pop(upstream, None)
        await self._publish(snapshot)

    async def _publish(self, snapshot: CatalogSnapshot) -> None:
        changed = _changed_kinds(self.snapshot, snapshot)
        self.snapshot = snapshot
        if changed:
            for listener in self._listeners:
                await listener(changed)

    def _restore(self, upstream: str, previous: Listing | None) -> None:
        if previous is None:
            del self._listings[upstream]
        else:
            self._listings[upstream] = previous


def _changed_kinds(old: CatalogSnapshot, new: CatalogSnapshot) -> frozenset[Kind]:
    kinds: set[Kind] = set()
    if _signature(old.tools) != _signature(new.tools):
        kinds.add("tools")
    if _signature(old.prompts) != _signature(new.prompts):
        kinds.add("prompts")
    if _signature(old.resources) != _signature(new.resources) or _templates(old) != _templates(new):
        kinds.add("resources")
    return frozenset(kinds)


def _templates(snapshot: CatalogSnapshot) -> list[tuple[str, types.ResourceTemplate]]:
    return [(entry.public, entry.origin.item) for entry in snapshot.templates]


def _signature(table: Mapping[str, Origin[Any]]) -> dict[str, Any]:
    return {name: origin.item for name, origin in table.items()}
