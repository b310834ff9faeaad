"""How well tool search finds the right tool: recall@1/5/10 and MRR on real tools and real requests.

The tools are the lists of real MCP servers from the npm registry and PyPI
(``bench/data/tool_search/tools.json``, harvested by ``bench/harvest_tools.py``); the queries
are requests written the way users ask, each labelled with every tool that would serve it
(``queries.json``; ``bench/data/tool_search/README.md`` says how). Three engines rank the same
tools for the same queries, in one run:

- ``agent-gateway``: the gateway's own index (``agent_gateway.search``), fed through the same
  catalog code a running gateway uses (one upstream per server, public names);
- ``bm25 (name+description)``: a plain BM25 (``bm25s``) over each tool's name and description,
  lower-cased, split on non-alphanumerics;
- ``fastmcp BM25SearchTransform``: FastMCP's own search transform over the same tools, called
  through its ``search_tools`` tool in memory.

``recall@k`` is the share of queries that some tool serves for which a right tool is among the
first k results; MRR is the mean reciprocal rank of the first right tool (0 when none is in
the first 10). For queries nothing serves (kind ``none``) the table shows how often the
gateway's best result was marked weak (score under ``search.tools.WEAK``) instead.

``--split dev|test`` keeps the queries with an odd or even id number: the thesaurus, the
index's weights and the action rerank's verbs and factor were adjusted looking only at
``dev`` failures, so ``test`` shows what that adjustment is worth on requests it never saw.

Run from the repository root::

    .venv/bin/python bench/tool_search.py [--split all|dev|test] [--show-misses N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import mcp_types as types
from fastmcp import Client as FastMCPClient
from fastmcp import FastMCP
from fastmcp.server.transforms.search import BM25SearchTransform
from fastmcp.tools.base import Tool

from agent_gateway.catalog import Catalog
from agent_gateway.catalog_parts import Listing
from agent_gateway.config import EmbeddingsConfig
from agent_gateway.config_files import parse_config
from agent_gateway.search.engine import ToolSearch
from agent_gateway.search.tools import WEAK

DATA = Path(__file__).resolve().parent / "data" / "tool_search"
PREFIXES = {"minilm": ("", ""), "mpnet": ("", ""), "e5": ("query: ", "passage: ")}
"""Each model's query and document prefixes (``bench/embeddings_server.py --model``)."""
KS = (1, 5, 10)
Ranker = Callable[[str], Awaitable[list[tuple[str, float]]]]
"""A query -> ranked (``server/tool``, score), best first, at most 10."""


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    kinds: tuple[str, ...]
    relevant: frozenset[str]


@dataclass
class Tally:
    n: int = 0
    hits: dict[int, int] = field(default_factory=lambda: dict.fromkeys(KS, 0))
    rr: float = 0.0
    weak: int = 0

    def add(self, ranked: Sequence[str], relevant: frozenset[str]) -> None:
        self.n += 1
        first = next((i for i, key in enumerate(ranked[:10]) if key in relevant), None)
        for k in KS:
            self.hits[k] += first is not None and first < k
        self.rr += 0.0 if first is None else 1.0 / (first + 1)


def load() -> tuple[list[dict[str, Any]], list[Query]]:
    servers = json.loads((DATA / "tools.json").read_text())["servers"]
    raw = json.loads((DATA / "queries.json").read_text())
    items = raw["queries"] if isinstance(raw, dict) else raw
    queries = [Query(q["id"], q["text"], tuple(q["kinds"]), frozenset(q["relevant"])) for q in items]
    return servers, queries


def upstream_name(server: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "-", server).strip("-")[:32]


# -- the gateway's engine ------------------------------------------------------------------------


@asynccontextmanager
async def gateway_ranker(
    servers: list[dict[str, Any]],
    embeddings: EmbeddingsConfig | None = None,
    upstreams: dict[str, dict[str, Any]] | None = None,
) -> AsyncIterator[Ranker]:
    """The gateway's engine; with ``embeddings`` (an OpenAI-compatible base URL), fused with
    dense retrieval, once every tool is embedded. ``upstreams``: more settings of some
    upstreams (``search_weight``), by upstream name."""
    names = {upstream_name(s["name"]): s for s in servers}
    more = upstreams or {}
    config = parse_config(
        {"upstreams": {n: {"command": "true"} | more.get(n, {}) for n in names}, "agent": {"enabled": False}},
        {},
        source="bench",
    )
    catalog = Catalog(config)
    for name, server in names.items():
        tools = tuple(types.Tool.model_validate(t) for t in server["tools"])
        await catalog.update(name, Listing(tools=tools, instructions=server.get("instructions")))
    snapshot = catalog.start()
    search = ToolSearch(embeddings)
    back = {public: f"{names[o.upstream]['name']}/{o.name}" for public, o in snapshot.tools.items()}

    async def rank(query: str) -> list[tuple[str, float]]:
        found, _ = await search.search(snapshot, query, 10)
        return [(back[f.tool.name], f.score) for f in found]

    async with search.running():
        await search.load(snapshot)
        while embeddings is not None and not search.embedded(len(snapshot.tools)):
            await asyncio.sleep(0.2)
        yield rank


# -- plain BM25 over name and description --------------------------------------------------------


def plain_bm25_ranker(servers: list[dict[str, Any]]) -> Ranker:
    keys: list[str] = []
    corpus: list[list[str]] = []
    for server in servers:
        for tool in server["tools"]:
            keys.append(f"{server['name']}/{tool['name']}")
            corpus.append(_plain(f"{tool['name']} {tool.get('description') or ''}"))
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)

    async def rank(query: str) -> list[tuple[str, float]]:
        tokens = [t for t in _plain(query) if t in index.vocab_dict]
        if not tokens:
            return []
        scores = index.get_scores(tokens)
        best = sorted(range(len(keys)), key=lambda i: -scores[i])[:10]
        return [(keys[i], float(scores[i])) for i in best if scores[i] > 0]

    return rank


def _plain(text: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", text.lower()) if t]


# -- FastMCP's search transform --------------------------------------------------------------------


@asynccontextmanager
async def fastmcp_ranker(servers: list[dict[str, Any]]) -> AsyncIterator[Ranker]:
    server = FastMCP("bench")

    def run() -> str:
        return ""

    template = Tool.from_function(run, name="template")
    back: dict[str, str] = {}
    for entry in servers:
        for tool in entry["tools"]:
            public = f"{upstream_name(entry['name'])}_{tool['name']}"[:128]
            back[public] = f"{entry['name']}/{tool['name']}"
            update = {
                "name": public,
                "description": tool.get("description"),
                "parameters": tool["inputSchema"],
            }
            server.add_tool(template.model_copy(update=update))
    server.add_transform(BM25SearchTransform(max_results=10))

    async with FastMCPClient(server) as client:

        async def rank(query: str) -> list[tuple[str, float]]:
            result = await client.call_tool("search_tools", {"query": query})
            return [(back[n], 0.0) for n in _names_in(result) if n in back]

        yield rank


def _names_in(result: Any) -> list[str]:
    """The tool names in a ``search_tools`` result of FastMCP's (structured, or JSON text)."""
    data = result.structured_content
    if isinstance(data, dict):
        data = data.get("result", data)
    if not isinstance(data, list):
        text = "".join(getattr(b, "text", "") for b in result.content)
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return []
    return [t["name"] for t in data if isinstance(t, dict) and "name" in t] if isinstance(data, list) else []


# -- the run ------------------------------------------------------------------------------------------


async def evaluate(rank: Ranker, queries: Sequence[Query]) -> tuple[dict[str, Tally], list[float], list[str]]:
    tallies: dict[str, Tally] = {}
    times: list[float] = []
    misses: list[str] = []
    for query in queries:
        started = time.perf_counter()
        ranked = await rank(query.text)
        times.append(time.perf_counter() - started)
        keys = [k for k, _ in ranked]
        if not query.relevant:
            tally = tallies.setdefault("none", Tally())
            tally.n += 1
            tally.weak += not ranked or ranked[0][1] < WEAK
            continue
        for kind in ("all", *query.kinds):
            tallies.setdefault(kind, Tally()).add(keys, query.relevant)
        if not any(k in query.relevant for k in keys[:5]):
            misses.append(
                f"{query.id} {query.text!r}\n    got: {keys[:5]}\n    want: {sorted(query.relevant)[:6]}"
            )
    return tallies, times, misses


def table(results: dict[str, dict[str, Tally]], engines: Sequence[str]) -> str:
    kinds = ["all", *sorted({k for r in results.values() for k in r} - {"all", "none"})]
    lines = [
        "| kind | n | engine | recall@1 | recall@5 | recall@10 | MRR |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        for engine in engines:
            tally = results[engine].get(kind)
            if tally is None or not tally.n:
                continue
            r = [tally.hits[k] / tally.n for k in KS]
            lines.append(
                f"| {kind} | {tally.n} | {engine} | {r[0]:.2f} | {r[1]:.2f} | {r[2]:.2f} | {tally.rr / tally.n:.3f} |"
            )
    none = results[engines[0]].get("none")
    if none is not None and none.n:
        lines.append(
            f"\nqueries nothing serves: {none.n}; the gateway marked its best result weak for "
            f"{none.weak} ({none.weak / none.n:.0%})"
        )
    return "\n".join(lines)


def latency(times: dict[str, list[float]]) -> str:
    lines = ["| engine | p50 ms | p99 ms |", "|---|---:|---:|"]
    for engine, values in times.items():
        ordered = sorted(values)
        p50 = ordered[len(ordered) // 2] * 1e3
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3
        lines.append(f"| {engine} | {p50:.2f} | {p99:.2f} |")
    return "\n".join(lines)


def selected(queries: list[Query], split: str) -> list[Query]:
    if split == "all":
        return queries
    odd = split == "dev"
    return [q for q in queries if (int(re.sub(r"\D", "", q.id) or 0) % 2 == 1) == odd]


async def run(
    queries: list[Query],
    servers: list[dict[str, Any]],
    show_misses: int,
    embeddings: EmbeddingsConfig | None,
) -> None:
    async with (
        fastmcp_ranker(servers) as fastmcp,
        gateway_ranker(servers) as ours,
        gateway_ranker(servers, embeddings) as fused,
    ):
        engines = {"agent-gateway": ours}
        if embeddings:
            engines[f"agent-gateway + {embeddings.model}"] = fused
        engines |= {
            "bm25 (name+description)": plain_bm25_ranker(servers),
            "fastmcp BM25SearchTransform": fastmcp,
        }
        results: dict[str, dict[str, Tally]] = {}
        times: dict[str, list[float]] = {}
        misses: list[str] = []
        for engine, rank in engines.items():
            results[engine], times[engine], missed = await evaluate(rank, queries)
            misses = missed if engine.startswith("agent-gateway") else misses
    print(table(results, list(engines)))
    print("\nper query, in this process:\n" + latency(times))
    for miss in misses[:show_misses]:
        print(miss)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--split", choices=["all", "dev", "test"], default="all")
    parser.add_argument("--show-misses", type=int, default=0, help="print the gateway's first N misses@5")
    parser.add_argument(
        "--embeddings",
        metavar="URL",
        help="also rank with dense retrieval through this OpenAI-compatible base URL "
        "(e.g. http://127.0.0.1:8089/v1 from bench/embeddings_server.py)",
    )
    parser.add_argument("--model", choices=sorted(PREFIXES), default="minilm", help="the server's --model")
    options = parser.parse_args(argv)
    servers, queries = load()
    queries = selected(queries, options.split)
    tools = sum(len(s["tools"]) for s in servers)
    print(f"{len(servers)} servers, {tools} tools, {len(queries)} queries ({options.split})\n")
    embeddings = None
    if options.embeddings:
        query, document = PREFIXES[options.model]
        embeddings = EmbeddingsConfig(
            base_url=options.embeddings,
            model=options.model,
            timeout=600,
            query_prefix=query,
            document_prefix=document,
        )
    asyncio.run(run(queries, servers, options.show_misses, embeddings))
    print(f"\ncommand: {shlex.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
