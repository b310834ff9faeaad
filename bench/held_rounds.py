"""What a held call's round costs when the client's retry reaches another replica than the
one holding the call (``store/rounds.py``: the round sent over Redis and its outcome sent
back), against the retry reaching the holder itself.

Two ``agent-gateway serve`` processes share a Redis this script starts (as
``tests/replicas`` does), each with its own session to one handshake-era upstream in this
process that asks (elicitation) and answers. One modern client per replica, both the same
token: each call's first round goes to replica 0, its retry (with the answer) to replica 0
(local) or to replica 1 (across), alternating, ``--calls`` of each in ``--rounds`` rounds.
Printed: the median over rounds of the mean milliseconds of the retry alone and of the whole
two-round call, and their ratio to local.

    .venv/bin/python bench/held_rounds.py [--calls 50] [--rounds 5]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import mcp_types as types
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.replicas.cluster import replicas
from tests.replicas.services import redis_server
from tests.replicas.test_held_rounds import TOKEN_ENV, accepting, asking_server, config, modern
from tests.support import serving_upstream


async def two_rounds(first: Client, retry: Client) -> tuple[float, float]:
    """One held call: asked through ``first``, answered through ``retry``; (retry, whole) ms."""
    began = time.perf_counter()
    asked = await first.session.call_tool("asker__ask", {}, allow_input_required=True)
    assert isinstance(asked, types.InputRequiredResult), asked
    [key] = asked.input_requests or {}
    answered_at = time.perf_counter()
    done = await retry.session.call_tool(
        "asker__ask", {}, input_responses={key: accepting("ada")}, request_state=asked.request_state
    )
    assert isinstance(done, types.CallToolResult), done
    assert not done.is_error, done.content
    ended = time.perf_counter()
    return (ended - answered_at) * 1e3, (ended - began) * 1e3


async def main(calls: int, rounds: int) -> None:
    answered: list[str] = []
    rows: dict[str, list[tuple[float, float]]] = {"local": [], "across": []}
    with redis_server() as redis, tempfile.TemporaryDirectory() as directory:
        async with (
            serving_upstream(asking_server(answered)) as upstream,
            replicas(config(redis, "bench", upstream), Path(directory), env=TOKEN_ENV) as cluster,
            AsyncExitStack() as stack,
        ):
            on_0 = await modern(stack, cluster.endpoint(0), "alice")
            on_1 = await modern(stack, cluster.endpoint(1), "alice")
            for retry in (on_0, on_1):  # warm up
                for _ in range(5):
                    await two_rounds(on_0, retry)
            for _ in range(rounds):
                for name, retry in (("local", on_0), ("across", on_1)):
                    times = [await two_rounds(on_0, retry) for _ in range(calls)]
                    rows[name].append(
                        (statistics.mean(t[0] for t in times), statistics.mean(t[1] for t in times))
                    )
                answered.clear()
    medians = {
        k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rows.items()
    }
    local = medians["local"]
    print("command: .venv/bin/python bench/held_rounds.py " + shlex.join(sys.argv[1:]))
    print()
    print("| the retry reaches | retry ms | vs local | whole call (two rounds) ms | vs local |")
    print("|---|---:|---:|---:|---:|")
    for name, label in (("local", "the replica holding the call"), ("across", "the other replica")):
        retry_ms, whole_ms = medians[name]
        print(
            f"| {label} | {retry_ms:.2f} | {retry_ms / local[0]:.2f}x | {whole_ms:.2f} | {whole_ms / local[1]:.2f}x |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=50, help="held calls per case per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the cases alternating")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.rounds)
