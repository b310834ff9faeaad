"""Resources and resource templates under their public URIs: a URI (or template) one upstream
lists keeps its own; one several list is published once per upstream as ``{upstream}+{uri}``,
and so is one that begins as another's would (``docs+file:///readme``). Pure functions over
the upstreams' listings, in configuration order."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import mcp_types as types
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from agent_gateway.catalog_parts import Listing, Part
from agent_gateway.errors import UnmatchedURI, shown
from agent_gateway.naming import Origin

logger = logging.getLogger("agent_gateway.catalog")

MAX_VARIABLES = 16
"""Variables in one resource template (the SDK takes 256): a template's parse is Python, about
0.1 ms a variable, and an upstream lists up to 10,000 (about 15 s of the event loop at 256)."""

READ_SCAN = 65_536
"""Characters the templates' matchers may scan for one URI a client reads (4-10 ms: a
matcher's scan is Python; 64 tries of a 1 KB URI, 8 of an 8 KB one, a client's longest). A
template with no literal text (``{v0}``), or whose literal text a URI holds, is tried by a
scan of the whole URI: an 8 KB read against 100 such templates held the event loop 47 ms,
twice a read (0.5 s at 1,000); past this, the read is refused (``UnmatchedURI``)."""

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


@dataclass(frozen=True, slots=True)
class ResourceTable:
    """Each upstream's resources by public URI, and what lets one upstream's change redo
    only its own share: before, every catalog change (any upstream's, its tools' too) made
    the whole table again, ~0.5 s of the event loop at 100,000 resources."""

    table: Mapping[str, Origin[types.Resource]] = field(default_factory=dict)
    """Every share, in configuration order."""
    shares: Mapping[str, Mapping[str, Origin[types.Resource]]] = field(default_factory=dict)
    parts: Mapping[str, Part] = field(default_factory=dict)
    """The part each share was made from."""
    owners: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """The upstreams listing each URI, by its ``spelling``."""
    upstreams: frozenset[str] = frozenset()


def resource_table(parts: Sequence[Part], upstreams: frozenset[str], before: ResourceTable) -> ResourceTable:
    """The resource table of ``parts`` (in configuration order): the shares of the upstreams
    whose part changed, and of those listing a URI whose owners changed, made again; the rest
    kept. URIs are compared as clients see them (their ``spelling``): before, an upstream
    listing ``file:///x/../doc`` was listed as, and took the reads of, another's
    ``file:///doc``, and ``DOCS+file:///a`` was ``docs+file:///a``."""
    if before.upstreams != upstreams:  # a name more or less may make any URI foreign
        before = ResourceTable(table=before.table, upstreams=upstreams)  # what was served stays
    now = {part.upstream: part for part in parts}
    if now.keys() == before.parts.keys() and all(now[name] is part for name, part in before.parts.items()):
        return before if list(now) == list(before.parts) else _joined(before.shares, now, before)
    changed = [name for name in {**before.parts, **now} if before.parts.get(name) is not now.get(name)]
    owners, touched = _owners(before, now, changed)
    redo = set(changed).union(*(owners.get(seen, ()) for seen in touched))
    lowered = frozenset(u.lower() for u in upstreams)  # a spelling's scheme is lower-case
    shares = {
        name: _share(part, owners, before.table, upstreams, lowered) if name in redo else before.shares[name]
        for name, part in now.items()
    }
    return _joined(shares, now, ResourceTable(owners=owners, upstreams=upstreams))


def _owners(
    before: ResourceTable, now: Mapping[str, Part], changed: list[str]
) -> tuple[Mapping[str, frozenset[str]], set[str]]:
    """The upstreams listing each spelling, after ``changed`` upstreams' parts; and the
    spellings whose owners changed (only those an upstream began or stopped listing: a
    change of its tools alone touches none)."""
    owners: dict[str, frozenset[str]] | None = None
    touched: set[str] = set()
    for name in changed:
        old, new = before.parts.get(name), now.get(name)
        was = set(old.spellings.values()) if old is not None else set[str]()
        will = set(new.spellings.values()) if new is not None else set[str]()
        if was == will:
            continue
        owners = dict(before.owners) if owners is None else owners
        for seen in was - will:
            if left := owners.pop(seen) - {name}:
                owners[seen] = left
        for seen in will - was:
            owners[seen] = owners.get(seen, frozenset()) | {name}
        touched |= was ^ will
    return (before.owners if owners is None else owners), touched


def _joined(
    shares: Mapping[str, Mapping[str, Origin[types.Resource]]], now: dict[str, Part], table: ResourceTable
) -> ResourceTable:
    """``table`` with ``shares`` joined in the order of ``now`` (configuration order)."""
    joined: dict[str, Origin[types.Resource]] = {}
    ordered = {name: shares[name] for name in now}
    for share in ordered.values():
        joined.update(share)
    return ResourceTable(joined, ordered, now, table.owners, table.upstreams)


def _share(
    part: Part,
    owners: Mapping[str, frozenset[str]],
    before: Mapping[str, Origin[types.Resource]],
    upstreams: frozenset[str],
    lowered: frozenset[str],
) -> dict[str, Origin[types.Resource]]:
    """``part``'s resources by public URI."""
    share: dict[str, Origin[types.Resource]] = {}
    spelled = part.spellings
    for resource in part.listing.resources:
        uri = str(resource.uri)
        seen = spelled[uri]
        foreign = namespace_of(uri, upstreams) or (seen != uri and namespace_of(seen, lowered))
        kept = not foreign and _keeps(part.upstream, uri, owners[seen], before)
        share[uri if kept else f"{part.upstream}+{uri}"] = Origin(part.upstream, uri, resource)
    return share


@dataclass(slots=True)
class Scan:
    """Characters the template matchers may still scan for one lookup, or one answer's links
    (``resource_links``): a matcher's scan is Python, O(len(uri)), 0.06-0.15 us a character."""

    left: int

    def spend(self, chars: int) -> bool:
        """Take ``chars`` from what is left; False once it is spent."""
        self.left -= chars
        return self.left >= 0


class Unscanned(Exception):
    """A URI's match was cut short: its ``Scan`` is spent."""


def matching(
    entries: tuple[TemplateEntry, ...], uri: str, upstreams: frozenset[str], scan: Scan | None = None
) -> TemplateEntry | None:
    """The first of ``entries`` (most specific first) that ``uri`` matches. A URI in an
    upstream's namespace (``docs+…``) is matched by that upstream's qualified templates only:
    another's catch-all (``{+uri}``) or leading expression (``{s}+file:///{x}``) never takes
    a read a client addressed to ``docs``. ``scan``: raises ``Unscanned`` once spent; none:
    ``READ_SCAN`` characters, then ``UnmatchedURI``."""
    if scan is not None:
        return _matching(entries, uri, upstreams, scan)
    try:
        return _matching(entries, uri, upstreams, Scan(READ_SCAN))
    except Unscanned:
        raise UnmatchedURI(uri, READ_SCAN) from None


MATCHED = 1 << 20
"""Bytes of URIs (their strings and their entries) whose match one snapshot keeps
(``Matches``), then forgets them all. Counted in characters, a client reading short fresh
URIs (``a:10000``, ``a:10001``...) had it keep 150,000 of them, 12 MB."""
_SLOT = 48
"""A kept URI's share of the dict beside its string (its entry, its index, the table's slack)."""


class Matches:
    """The match of each URI looked up in one snapshot's templates, kept: a read's URI is
    looked up by its span, its route and the contents it gets back (its policy's, for an
    alias, is another's), each a scan of up to ``READ_SCAN`` characters. Kept, it costs one."""

    def __init__(self) -> None:
        self._ordered: tuple[TemplateEntry, ...] | None = None
        self._found: dict[str, TemplateEntry | _GivenUp | None] = {}
        self._bytes = 0

    def matching(
        self, templates: tuple[TemplateEntry, ...], uri: str, upstreams: frozenset[str], scan: Scan | None
    ) -> TemplateEntry | None:
        """``matching`` over ``templates`` (the snapshot's, always the same), once per URI: a
        match given up at ``READ_SCAN`` is kept so, and raised as the lookup's own bound says;
        one cut short by a ``Scan`` is not kept (it may have had less than that left)."""
        if uri in self._found:
            if isinstance(found := self._found[uri], _GivenUp):
                raise Unscanned(uri) if scan is not None else UnmatchedURI(uri, READ_SCAN)
            return found
        if self._ordered is None:
            self._ordered = most_specific_first(templates)
        try:
            entry = matching(self._ordered, uri, upstreams, scan)
        except UnmatchedURI:
            self._keep(uri, _GivenUp())
            raise
        self._keep(uri, entry)
        return entry

    def _keep(self, uri: str, found: TemplateEntry | _GivenUp | None) -> None:
        size = sys.getsizeof(uri) + _SLOT
        if self._bytes + size > MATCHED:
            self._found.clear()
            self._bytes = 0
        self._found[uri] = found
        self._bytes += size


class _GivenUp:
    """What ``Matches`` keeps of a URI whose match was given up at ``READ_SCAN``."""


def _matching(
    entries: tuple[TemplateEntry, ...], uri: str, upstreams: frozenset[str], scan: Scan
) -> TemplateEntry | None:
    namespace = namespace_of(uri, upstreams)
    glance = len(uri) >> 8  # may_match's search for literal text: C, some 250 times the scan's pace
    for entry in entries:
        if entry.prefix != namespace:
            continue
        if glance and not scan.spend(glance):
            raise Unscanned(uri)
        if entry.may_match(uri):
            if not scan.spend(len(uri)):
                raise Unscanned(uri)
            if entry.matcher.match(uri) is not None:
                return entry
    return None


def _keeps(
    upstream: str, uri: str, owners: frozenset[str], before: Mapping[str, Origin[types.Resource]]
) -> bool:
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
