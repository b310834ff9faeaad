"""What making an answer's resource links public costs (``resource_links.py``), against the
parse of that answer from JSON (what every answer costs already), in the same run.

One upstream lists ``T`` resource templates (``t0://{n}`` ...); its tool answers with ``L``
resource links to URIs no template matches (``x://n``: each is tried against every template
before it is qualified, the worst case). Measured with the bound on template matches per
answer (``LOOKUPS``) and on characters scanned (``SCANNED``), as shipped, and without them
(both set past any answer: the code before the bounds), in ms of one core per answer, the
median of a few runs. The last rows are the worst case for the scan: templates with no
literal text (``{v0}``: any URI may match, so each try scans the whole URI) and 60 KB links.

    .venv/bin/python bench/resource_links.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import mcp_types as types

from agent_gateway import resource_links
from agent_gateway.catalog import CatalogSnapshot, build_snapshot
from agent_gateway.catalog_parts import Listing
from agent_gateway.config_files import parse_config

SIZES = [(2, 1), (2, 1_000), (1_000, 1), (1_000, 1_000), (10_000, 1), (10_000, 100), (10_000, 1_000)]
WORST = [(100, 3), (1_000, 1), (1_000, 20)]
"""Templates of no literal text against links of 60 KB: each try a scan of the whole URI."""
UNBOUNDED_WORK = 2_000_000
"""Template matches past which the unbounded row is not run (its time per link is shown)."""


def snapshot_of(templates: int, bare: bool = False) -> CatalogSnapshot:
    """``templates`` of ``t{i}://{n}``, or ``bare``: ``{v{i}}`` (no literal text: any URI may match)."""
    config = parse_config({"upstreams": {"up": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="bench")
    shape = "{{v{i}}}" if bare else "t{i}://{{n}}"
    listed = tuple(
        types.ResourceTemplate(uri_template=shape.format(i=i), name=f"t{i}") for i in range(templates)
    )
    return build_snapshot(config, {"up": Listing(templates=listed)}, version=1)


def answer_of(links: int, long: bool = False) -> str:
    """``links`` to ``x://n``, or ``long`` ones (60 KB each)."""
    stem = "x://" + "a." * 30_000 if long else "x://"
    content = [{"type": "resource_link", "uri": f"{stem}{n}", "name": f"x{n}"} for n in range(links)]
    return json.dumps({"content": content})


def timed(work: Callable[[], object], runs: int = 5) -> float:
    """The median of ``runs`` runs of ``work``, in ms."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def row(templates: int, links: int, worst: bool = False) -> str:
    """One row of the table: the parse, and the links made public with and without the bounds
    (``worst``: templates with no literal text, links of 60 KB)."""
    snapshot, text = snapshot_of(templates, worst), answer_of(links, worst)
    result = types.CallToolResult.model_validate_json(text)
    first = result.model_copy(update={"content": result.content[:1]})
    parse = timed(lambda: types.CallToolResult.model_validate_json(text))
    bounded = timed(lambda: resource_links.linked_result(result, "up", snapshot))
    shipped = resource_links.LOOKUPS, resource_links.SCANNED
    resource_links.LOOKUPS = resource_links.SCANNED = 10**18
    try:
        if templates * links * (30_000 if worst else 1) <= UNBOUNDED_WORK:
            unbounded = timed(lambda: resource_links.linked_result(result, "up", snapshot), runs=3)
            shown = f"{unbounded:.2f} ({unbounded / parse:.1f}x)"
        else:
            one = timed(lambda: resource_links.linked_result(first, "up", snapshot), runs=1 if worst else 5)
            shown = f"not run: {one:.2f} a link, ~{one * links / 1e3:.1f} s"
    finally:
        resource_links.LOOKUPS, resource_links.SCANNED = shipped
    return f"| {'none, ' if worst else ''}{templates:,} | {'60 KB, ' if worst else ''}{links:,} | {parse:.2f} | {bounded:.2f} ({bounded / parse:.1f}x) | {shown} |"


def main() -> None:
    print(
        "| templates | links | parse of the answer ms | public, bounded ms (x parse) | public, unbounded ms (x parse) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for templates, links in SIZES:
        print(row(templates, links))
    for templates, links in WORST:
        print(row(templates, links, worst=True))
    print("\ncommand: `.venv/bin/python bench/resource_links.py`")


if __name__ == "__main__":
    main()
