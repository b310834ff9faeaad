"""What upstreams' instructions do to tool search: recall with and without them.

The catalog and requests are ``tool_search.py``'s (2,900 real tools of 49 servers, 336
requests; the harvested servers carry no instructions). Each row gives the servers
instructions of a kind real servers write, and ranks the same requests with the gateway's
lexical index:

- ``none``: as harvested;
- ``generic-half`` / ``generic-all``: a paragraph of usage advice (94 words) on every other
  server / on all of them;
- ``long-half``: that paragraph four times over on every other server;
- ``descriptive``: each server saying what it works with and naming every one of its tools
  ("This server works with code hosting. It provides tools to: create issue, ...").

Run it against another checkout's ``src`` (a worktree of the code before) with
``PYTHONPATH=/tmp/before/src`` to compare.

    .venv/bin/python bench/search_instructions.py
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tool_search as ts

GENERIC = (
    "Use these tools carefully. Always confirm with the user before making changes that cannot be "
    "undone. Results may be paginated: pass the cursor returned by a previous call to get the next "
    "page. Authentication is handled by the server; never ask the user for credentials. Prefer the "
    "most specific tool for the task, and report errors to the user exactly as returned. Rate limits "
    "apply: if a call is refused, wait before retrying. Dates are ISO 8601 in UTC. Identifiers are "
    "opaque strings; do not guess them, list or search first."
)
MODES = ("none", "generic-half", "generic-all", "long-half", "descriptive")


def instructed(servers: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, server in enumerate(servers):
        text = None
        if mode == "generic-all" or (mode == "generic-half" and i % 2 == 0):
            text = GENERIC
        elif mode == "long-half" and i % 2 == 0:
            text = " ".join([GENERIC] * 4)
        elif mode == "descriptive":
            names = ", ".join(tool["name"].replace("_", " ") for tool in server["tools"])
            text = f"This server works with {server['domain']}. It provides tools to: {names}."
        out.append(server | {"instructions": text} if text else server)
    return out


async def run() -> None:
    servers, queries = ts.load()
    print("| instructions | recall@1 | recall@5 | recall@10 |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        async with ts.gateway_ranker(instructed(servers, mode)) as rank:
            tallies, _, _ = await ts.evaluate(rank, queries)
        tally = tallies["all"]
        print(f"| {mode} | " + " | ".join(f"{tally.hits[k] / tally.n:.3f}" for k in ts.KS) + " |")


if __name__ == "__main__":
    asyncio.run(run())
    print(f"\ncommand: {shlex.join([Path(sys.executable).name, *sys.argv])}")
