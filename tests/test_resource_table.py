"""The resource table made again only where one upstream's change reaches (``catalog_resources``):
after any sequence of changes it is the table made whole from the same parts and the same
previous table (which URI an upstream keeps unqualified depends on what was served before)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_gateway.catalog import Catalog, merge
from agent_gateway.catalog_parts import Listing, Part, build_part
from agent_gateway.catalog_resources import ResourceTable, resource_table
from agent_gateway.config import GatewayConfig
from agent_gateway.config_files import parse_config

UPSTREAMS = ("a", "b", "c")
CONFIG = parse_config(
    {"upstreams": {name: {"url": f"http://127.0.0.1:9/{name}"} for name in UPSTREAMS}}, {}, source="test"
)
URIS = (
    "file:///doc",
    "file:///x/../doc",  # the same spelling as the first
    "FILE:///doc",
    "file:///other",
    "b+file:///doc",  # in b's namespace
    "note://a",
    "note://b",
)
listings = st.lists(st.sampled_from(URIS), max_size=5).map(
    lambda uris: Listing(resources=tuple(types.Resource(uri=uri, name=uri) for uri in uris))
)
changes = st.lists(st.tuples(st.sampled_from(UPSTREAMS), st.none() | listings), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(first=st.fixed_dictionaries({name: listings for name in UPSTREAMS}), changes=changes)
def test_a_table_kept_across_changes_is_the_table_made_whole(
    first: dict[str, Listing], changes: list[tuple[str, Listing | None]]
) -> None:
    current: dict[str, Part] = {name: build_part(CONFIG, name, listing) for name, listing in first.items()}
    snapshot = merge(list(current.values()), 1)
    for upstream, listing in changes:  # None: the upstream is gone (down, hidden, removed)
        if listing is None:
            current.pop(upstream, None)
        else:
            current[upstream] = build_part(CONFIG, upstream, listing)
        parts = [current[name] for name in UPSTREAMS if name in current]
        after = merge(parts, snapshot.version + 1, snapshot)
        whole = resource_table(parts, frozenset(UPSTREAMS), ResourceTable(table=snapshot.resources))
        assert list(after.resources.items()) == list(whole.table.items())
        snapshot = after


def resources(*uris: str) -> Listing:
    return Listing(resources=tuple(types.Resource(uri=uri, name=uri) for uri in uris))


def config(**upstreams: dict[str, Any]) -> GatewayConfig:
    return parse_config(
        {"upstreams": {n: {"url": f"http://127.0.0.1:9/{n}", **u} for n, u in upstreams.items()}},
        {},
        source="t",
    )


async def test_a_reload_leaves_a_served_uri_with_the_upstream_that_served_it() -> None:
    # docs serves note://readme; later evil lists it too and gets only evil+note://readme.
    # A reload that changes neither (a policy, a timeout of a third upstream) made the table
    # with nothing served before: both were qualified, and docs's clients' note://readme
    # became unknown (their reads of it refused) until the next change of any upstream.
    catalog = Catalog(config(docs={}, evil={}, other={}))
    await catalog.update("docs", resources("note://readme"))
    await catalog.update("evil", resources("note://other"))
    catalog.start()
    await catalog.update("evil", resources("note://other", "note://readme"))
    before = {uri: origin.upstream for uri, origin in catalog.snapshot.resources.items()}
    assert before == {"note://readme": "docs", "note://other": "evil", "evil+note://readme": "evil"}
    await catalog.reconfigure(config(docs={}, evil={}, other={"timeout": 5}), ["other"])
    after = {uri: origin.upstream for uri, origin in catalog.snapshot.resources.items()}
    assert after == before
    await catalog.reconfigure(config(docs={}, evil={}), ["other"])  # one upstream fewer
    after = {uri: origin.upstream for uri, origin in catalog.snapshot.resources.items()}
    assert after == before
