"""A bystander's calls while another client reads long URIs against many resource templates.

One upstream (the SDK's low-level server, loopback Streamable HTTP) lists ``--templates``
templates with no literal text (``{v0}``…: every URI may match, and each try is a Python scan
of the whole URI) and a tool ``echo``. ``--attackers`` clients each read 8 KB URIs that no
template matches (a client's longest), one after another, for the whole run; a bystander
makes ``--calls`` sequential ``echo`` calls meanwhile. Printed: the bystander's p50 and p99,
with no attack, and under the attack with the read bound as shipped
(``catalog_resources.READ_SCAN``), with each of a read's lookups its own match (the code
before ``Matches``) and without the bound too (set past any read: the code before it),
all in one process and one run (upstream, gateway and clients share its event loop, as a
gateway's clients share its loop)::

    .venv/bin/python bench/template_scans.py [--templates 100] [--attackers 4] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: make `tests` importable
from tests.support import running_gateway, serving  # noqa: E402

from agent_gateway import catalog_resources  # noqa: E402

HOSTILE = "x://" + "a." * 4_090  # 8,184 characters: each try scans it all, failing at its end


def hostile(n: int) -> str:
    """The ``n``th of an attacker's URIs: each its own (a URI's match is kept per snapshot,
    ``catalog_resources.Matches``; the same one read again would cost nothing), 8,184 characters."""
    return f"x://{n:08d}" + HOSTILE[12:]


def matched_at_each_lookup(
    self: catalog_resources.Matches, templates: Any, uri: str, upstreams: Any, scan: Any
) -> Any:
    """``Matches.matching`` as it was before it kept a URI's match: one match per lookup."""
    return catalog_resources.matching(catalog_resources.most_specific_first(templates), uri, upstreams, scan)


def upstream(templates: int) -> Server:
    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        listed = [types.ResourceTemplate(uri_template=f"{{v{i}}}", name=f"v{i}") for i in range(templates)]
        return types.ListResourceTemplatesResult(resource_templates=listed)

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    async def read_resource(ctx: Any, params: Any) -> types.ReadResourceResult:
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="read")])

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text="echoed")])

    return Server(
        "bare",
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def attacker(url: str, stop: anyio.Event, reads: list[int]) -> None:
    async with Client(url, mode="legacy") as client:
        while not stop.is_set():
            with suppress(MCPError):  # not found, or refused past the bound: either way, again
                await client.read_resource(hostile(reads[0]))
            reads[0] += 1


async def bystander(url: str, calls: int) -> list[float]:
    times: list[float] = []
    async with Client(url, mode="legacy") as client:
        for _ in range(calls):
            started = time.perf_counter()
            await client.call_tool("bare__echo", {})
            times.append((time.perf_counter() - started) * 1e3)
    return times


async def scenario(url: str, attackers: int, calls: int) -> tuple[list[float], int]:
    stop, reads = anyio.Event(), [0]
    times: list[float] = []
    async with anyio.create_task_group() as tg:
        for _ in range(attackers):
            tg.start_soon(attacker, url, stop, reads)
        await anyio.sleep(0.5 if attackers else 0)  # the attack under way first
        times += await bystander(url, calls)
        stop.set()
    return times, reads[0]


def row(name: str, times: list[float], reads: int) -> str:
    p50, p99 = statistics.median(times), statistics.quantiles(times, n=100)[98]
    return f"| {name} | {p50:.2f} | {p99:.2f} | {reads:,} |"


async def main(args: argparse.Namespace) -> None:
    shipped = catalog_resources.READ_SCAN
    async with (
        serving(upstream(args.templates).streamable_http_app()) as base,
        running_gateway({"upstreams": {"bare": {"url": f"{base}/mcp"}}}) as gw,
    ):
        rows = [row("no attack", *await scenario(gw.url, 0, args.calls))]
        rows.append(row("attack, bound as shipped", *await scenario(gw.url, args.attackers, args.calls)))
        kept = catalog_resources.Matches.matching
        catalog_resources.Matches.matching = matched_at_each_lookup  # type: ignore[method-assign]
        try:
            name = "attack, bound, each lookup its own match (before `Matches`)"
            rows.append(row(name, *await scenario(gw.url, args.attackers, args.calls)))
            catalog_resources.READ_SCAN = 10**18
            rows.append(
                row("attack, no bound (before both)", *await scenario(gw.url, args.attackers, args.calls))
            )
        finally:
            catalog_resources.READ_SCAN = shipped
            catalog_resources.Matches.matching = kept  # type: ignore[method-assign]
    print(f"{args.templates} templates of no literal text, {args.attackers} clients reading 8 KB URIs\n")
    print("| bystander | p50 ms | p99 ms | attacker reads |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    argv = " ".join(sys.argv[1:])
    print(f"\ncommand: `.venv/bin/python bench/template_scans.py{' ' + argv if argv else ''}`")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--templates", type=int, default=100)
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    anyio.run(main, parser.parse_args())
