"""Validate the tool-search benchmark's queries against its harvested tools, and summarise them.

    .venv/bin/python bench/check_queries.py

Checks that ids and texts are unique, every label names a tool in tools.json (`server/tool`),
kinds are valid and consistent: `none` exactly when nothing is relevant, one of `intent` or
`product` otherwise, `large_server` exactly when a relevant tool lives in a server of at least
100 tools, and `no_overlap` exactly when the query shares no content word with the name of any of
its relevant tools. Exits 1 and lists the problems when a check fails.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "tool_search"
KINDS = ("intent", "product", "large_server", "no_overlap", "none")
LARGE_SERVER_TOOLS = 100
# Function words of requests and of tool names; anything else is a content word.
_STOPWORD_TEXT = """a about above after again all am an and any are as at be been before being below between both
    but by can could did do does doing don down during each few for from further had has have having he
    her here hers him his how i if in into is it its itself just let me more most my myself no nor not
    now of off on once only or other our ours out over own please same she should so some such than that
    the their theirs them then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours i'm it's we're that's
    what's who's don't isn't can't won't let's"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    kinds: tuple[str, ...]
    relevant: tuple[str, ...]


def words(text: str) -> set[str]:
    """Lower-cased content words, camelCase and snake/kebab split, simple plurals stripped."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", text)
    tokens = re.findall(r"[a-z0-9']+", spaced.lower())
    return {singular(token.strip("'")) for token in tokens if token.strip("'") and token not in STOPWORDS}


def singular(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def tool_name(label: str) -> str:
    return label.split("/", 1)[1]


def load_tools(path: Path) -> tuple[set[str], dict[str, int]]:
    """Every `server/tool` label, and each server's tool count."""
    servers: list[dict[str, Any]] = json.loads(path.read_text())["servers"]
    labels = {f"{server['name']}/{tool['name']}" for server in servers for tool in server["tools"]}
    return labels, {server["name"]: len(server["tools"]) for server in servers}


def load_queries(path: Path) -> list[Query]:
    raw: list[dict[str, Any]] = json.loads(path.read_text())["queries"]
    return [Query(q["id"], q["text"], tuple(q["kinds"]), tuple(q["relevant"])) for q in raw]


def derived_kinds(query: Query, sizes: dict[str, int]) -> set[str]:
    """The kinds that follow from the labels alone: none, large_server, no_overlap."""
    if not query.relevant:
        return {"none"}
    kinds: set[str] = set()
    if any(sizes.get(label.split("/", 1)[0], 0) >= LARGE_SERVER_TOOLS for label in query.relevant):
        kinds.add("large_server")
    if not any(words(query.text) & words(tool_name(label)) for label in query.relevant):
        kinds.add("no_overlap")
    return kinds


def problems(queries: list[Query], labels: set[str], sizes: dict[str, int]) -> list[str]:
    found: list[str] = []
    for kind, seen in (("id", Counter(q.id for q in queries)), ("text", Counter(q.text for q in queries))):
        found += [f"duplicate {kind}: {value!r}" for value, count in seen.items() if count > 1]
    for query in queries:
        found += [f"{query.id}: {problem}" for problem in query_problems(query, labels, sizes)]
    return found


def query_problems(query: Query, labels: set[str], sizes: dict[str, int]) -> list[str]:
    found = [f"unknown kind {kind!r}" for kind in query.kinds if kind not in KINDS]
    found += [f"no such tool {label!r}" for label in query.relevant if label not in labels]
    if len(set(query.relevant)) != len(query.relevant):
        found.append("a label is repeated")
    if not query.text.strip():
        found.append("empty text")
    if query.relevant and len({"intent", "product"} & set(query.kinds)) != 1:
        found.append("a served query is exactly one of intent or product")
    derived = derived_kinds(query, sizes)
    declared = {"none", "large_server", "no_overlap"} & set(query.kinds)
    found += [f"kind {kind} follows from the labels but is missing" for kind in sorted(derived - declared)]
    found += [f"kind {kind} does not follow from the labels" for kind in sorted(declared - derived)]
    return found


def summary(queries: list[Query], sizes: dict[str, int]) -> str:
    rows = [f"{'kind':14} {'queries':>7}"]
    per_kind = Counter(kind for query in queries for kind in query.kinds)
    rows += [f"{kind:14} {per_kind[kind]:7}" for kind in KINDS]
    rows.append(f"{'all':14} {len(queries):7}")
    served = [query for query in queries if query.relevant]
    mean = sum(len(query.relevant) for query in served) / max(1, len(served))
    multi = sum(1 for query in served if len({label.split("/", 1)[0] for label in query.relevant}) > 1)
    rows.append(
        f"\nrelevant tools per served query: mean {mean:.1f}, max {max(len(q.relevant) for q in served)}"
    )
    rows.append(f"served by more than one server: {multi}")
    touched = Counter(label.split("/", 1)[0] for query in queries for label in set(query.relevant))
    rows.append("\nqueries per server: " + ", ".join(f"{name} {touched[name]}" for name in sizes))
    missing = [name for name in sizes if not touched[name]]
    rows.append(f"servers no query reaches: {', '.join(missing) or 'none'}")
    return "\n".join(rows)


def main() -> int:
    labels, sizes = load_tools(DATA / "tools.json")
    queries = load_queries(DATA / "queries.json")
    print(summary(queries, sizes))
    found = problems(queries, labels, sizes)
    for problem in found:
        print(f"ERROR {problem}", file=sys.stderr)
    print(f"\n{len(found)} problem(s)" if found else "\nall checks passed")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
