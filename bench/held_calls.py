"""What holding a call costs: a modern client's ``tools/call`` to a handshake-era upstream
runs in a task of the gateway's own when the client can be asked something (it declares
sampling, elicitation or roots: ``downstream/held_calls.py``), in the request's own task
when it cannot (the path every such call took before held calls, the baseline).

One gateway in this process, the recording upstream (FastMCP, handshake era) over loopback
Streamable HTTP in this process too, the official ``mcp`` client in the modern era; the two
clients alternate in ``--rounds`` rounds of ``--calls`` sequential calls of ``rec__whoami``.
Printed: the median over rounds of each client's mean milliseconds per call, and their ratio;
and the same for one held call answered in two rounds (``rec__ask``, the client's retry).

    .venv/bin/python bench/held_calls.py [--calls 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.servers import recorder
from tests.support import running_gateway, serving_upstream


async def elicited(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"value": "ada"})


async def per_call(client: Client, tool: str, arguments: dict[str, Any], calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result.content
    return (time.perf_counter() - began) / calls * 1e3


async def main(calls: int, rounds: int) -> None:
    seen: list[dict[str, Any]] = []
    rows: dict[str, list[float]] = {"plain": [], "held": [], "asked": []}
    async with (
        serving_upstream(recorder.build(seen.append)) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="auto") as plain,
        Client(gw.url, mode="auto", elicitation_callback=elicited) as held,
    ):
        for client in (plain, held):  # warm up
            await per_call(client, "rec__whoami", {}, 20)
        for _ in range(rounds):
            rows["plain"].append(await per_call(plain, "rec__whoami", {}, calls))
            rows["held"].append(await per_call(held, "rec__whoami", {}, calls))
            rows["asked"].append(await per_call(held, "rec__ask", {"question": "name?"}, max(1, calls // 4)))
            seen.clear()
    plain_ms, held_ms, asked_ms = (statistics.median(rows[k]) for k in ("plain", "held", "asked"))
    print("command: .venv/bin/python bench/held_calls.py " + shlex.join(sys.argv[1:]))
    print()
    print("| modern client -> handshake-era upstream | ms per call (median of rounds) | vs not held |")
    print("|---|---:|---:|")
    print(f"| cannot be asked: not held (the path before held calls) | {plain_ms:.2f} | 1.00x |")
    print(
        f"| can be asked, asked nothing: held, answered in one round | {held_ms:.2f} | {held_ms / plain_ms:.2f}x |"
    )
    print(
        f"| asked once (elicitation): two rounds, the client's retry | {asked_ms:.2f} | {asked_ms / plain_ms:.2f}x |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200, help="sequential calls per client per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the clients alternating")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.rounds)
