"""Resources and resource templates under their public URIs: a URI (or template) one upstream
lists keeps its own; one several list is published once per upstream as ``{upstream}+{uri}``,
and so is one that begins as another's would (``docs+file:///readme``). Pure functions over
the upstreams' listings, in configuration order."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

import mcp_types as types
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from agent_gateway.catalog_parts import Listing, spelling
from agent_gateway.errors import shown
from agent_gateway.naming import Origin

logger = logging.getLogger("agent_gateway.catalog")

MAX_VARIABLES = 16
"""Variables in one resource template (the SDK takes 256): a template's parse is Python, about
0.1 ms a variable, and an upstream lists up to 10,000 (about 15 s of the event loop at 256)."""

_EXPRESSION = re.compile(r"\{[^}]*\}")
"""A URI template's expression (``{name}``, ``{+path}``): what is left is its literal text."""


@dataclass(frozen=True, slots=True)
class TemplateEntry:
    """A public resource template and how to turn a matching URI into the upstream's URI."""

    public: str
    origin: Origin[types.ResourceTemplate]
    matcher: UriTemplate
    prefix: str
    head: str = ""
    """The literal text ``public`` begins with: a URI it matches begins with it too."""
    tail: str = ""
    """The literal text it ends with, if it has no query part: a URI it matches ends so."""
    literals: tuple[str, ...] = ()
    """Its other literal text, longest first: a URI it matches holds each, verbatim."""

    def may_match(self, uri: str) -> bool:
        """Whether ``uri`` may match, judged from the literal text alone, at C speed (the
        matcher's scan is Python: O(len(uri)) a template, 0.55 ms for 8 KiB)."""
        if not (uri.startswith(self.head) and uri.endswith(self.tail)):
            return False
        return all(text in uri for text in self.literals)

    def upstream_uri(self, uri: str) -> str:
        return uri[len(self.prefix) :]


def namespace_of(uri: str, upstreams: frozenset[str]) -> str:
    """The ``{upstream}+`` a URI begins with, when it names a configured upstream ("": none).
    Upstream names hold no ``+``: what comes before the first is the only name it can be."""
    head, plus, _ = uri.partition("+")
    return head + plus if plus and head in upstreams else ""


def resource_table(
    ordered: list[tuple[str, Listing]],
    before: Mapping[str, Origin[types.Resource]],
    upstreams: frozenset[str] = frozenset(),
    spelled: Mapping[str, str] | None = None,
) -> dict[str, Origin[types.Resource]]:
    """Each upstream's resources by public URI. URIs are compared as clients see them (their
    ``spelling``, from ``spelled`` when given): before, an upstream listing
    ``file:///x/../doc`` was listed as, and took the reads of, another's ``file:///doc``, and
    ``DOCS+file:///a`` was ``docs+file:///a``."""
    if spelled is None:
        spelled = {str(r.uri): spelling(str(r.uri)) for _, listing in ordered for r in listing.resources}
    lowered = frozenset(u.lower() for u in upstreams)  # a spelling's scheme is lower-case
    owners: dict[str, set[str]] = {}
    for upstream, listing in ordered:
        for resource in listing.resources:
            owners.setdefault(spelled[str(resource.uri)], set()).add(upstream)
    table: dict[str, Origin[types.Resource]] = {}
    for upstream, listing in ordered:
        for resource in listing.resources:
            uri = str(resource.uri)
            seen = spelled[uri]
            foreign = namespace_of(uri, upstreams) or (seen != uri and namespace_of(seen, lowered))
            kept = not foreign and _keeps(upstream, uri, owners[seen], before)
            public = uri if kept else f"{upstream}+{uri}"
            table[public] = Origin(upstream, uri, resource)
    return table


def matching(entries: tuple[TemplateEntry, ...], uri: str, upstreams: frozenset[str]) -> TemplateEntry | None:
    """The first of ``entries`` (most specific first) that ``uri`` matches. A URI in an
    upstream's namespace (``docs+…``) is matched by that upstream's qualified templates only:
    another's catch-all (``{+uri}``) or leading expression (``{s}+file:///{x}``) never takes
    a read a client addressed to ``docs``."""
    namespace = namespace_of(uri, upstreams)
    for entry in entries:
        if entry.prefix == namespace and entry.may_match(uri) and entry.matcher.match(uri) is not None:
            return entry
    return None


def _keeps(upstream: str, uri: str, owners: set[str], before: Mapping[str, Origin[types.Resource]]) -> bool:
    """Whether ``upstream``'s resource is published under its own URI. A URI several upstreams
    list is qualified with each one's name (``{upstream}+{uri}``), never dropped; but one that
    was already served unqualified stays its upstream's while it lists it: an upstream that
    starts listing another's URI does not take it from that upstream's clients."""
    if len(owners) == 1:
        return True
    served = before.get(uri)
    return served is not None and served.upstream == upstream


def template_entries(
    ordered: list[tuple[str, Listing]],
    upstreams: frozenset[str] = frozenset(),
    before: tuple[TemplateEntry, ...] = (),
) -> tuple[TemplateEntry, ...]:
    """The templates of ``ordered`` under their public URIs, matchers taken from ``before``
    (the last snapshot's) where the public URI is the same: one upstream's change parses only
    what changed (before, every catalog change parsed every template again: 5 s of the event
    loop for 5,000 templates of 100 variables)."""
    counts: dict[str, int] = {}  # upstreams listing each template (once each, however often)
    for _, listing in ordered:
        for text in {template.uri_template for template in listing.templates}:
            counts[text] = counts.get(text, 0) + 1
    parsed = {entry.public: entry.matcher for entry in before}
    entries: list[TemplateEntry] = []
    for upstream, listing in ordered:
        skipped: list[tuple[str, InvalidUriTemplate]] = []
        for template in listing.templates:
            alone = counts[template.uri_template] == 1 and not namespace_of(template.uri_template, upstreams)
            prefix = "" if alone else f"{upstream}+"
            public = prefix + template.uri_template
            try:
                matcher = parsed.get(public) or _parsed(public)
            except InvalidUriTemplate as exc:
                skipped.append((template.uri_template, exc))
                continue
            origin = Origin(upstream, template.uri_template, template)
            entries.append(TemplateEntry(public, origin, matcher, prefix, *_literal_text(public)))
        if skipped:  # one line per upstream: it chooses how many it lists
            first, why = skipped[0]
            logger.warning(
                "upstream %s: %d URI templates skipped (%s: %s)", upstream, len(skipped), shown(first), why
            )
    return tuple(entries)


def _parsed(public: str) -> UriTemplate:
    """``public`` parsed; one of too many variables refused before its parse (counted at C
    speed: refused only by the parse, each took it as long every catalog change)."""
    variables = sum(expression.count(",") + 1 for expression in _EXPRESSION.findall(public))
    if variables > MAX_VARIABLES:
        raise InvalidUriTemplate(f"{variables} variables, more than {MAX_VARIABLES}", template=public)
    return UriTemplate.parse(public, max_variables=MAX_VARIABLES)


def _literal_text(public: str) -> tuple[str, str, tuple[str, ...]]:
    """A template's literal text: its head, its tail (none when a query part, matched apart
    from the path, may follow it) and the rest, longest first."""
    head, *rest = _EXPRESSION.split(public)
    tail = rest.pop() if rest and "{?" not in public and "{&" not in public else ""
    return head, tail, tuple(sorted({text for text in rest if text}, key=len, reverse=True))


def most_specific_first(templates: tuple[TemplateEntry, ...]) -> tuple[TemplateEntry, ...]:
    """``templates`` in the order a URI is matched against them: the most literal text first
    (configuration order among equals), so one upstream's catch-all (``{+uri}``) does not take
    the reads another's ``file:///logs/{name}`` was written for."""
    return tuple(sorted(templates, key=lambda e: -len(_EXPRESSION.sub("", e.public))))
