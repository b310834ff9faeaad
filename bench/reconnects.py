"""A client that reconnects without DELETE, against two replicas behind nginx sharing Redis.

Many clients never end their sessions: they reconnect, each time a new session. At its
``max_sessions`` (10 here) counted across the replicas, such a client was refused until its
sessions' idle timeout; now its session touched the longest ago that no replica serves ends
for the new one (``store/room.py``). Rows, each against the same cluster:

- ``reconnects``: one client opening 60 sessions one after another through the balancer
  (``initialize``, ``notifications/initialized``, a ``tools/call``), never deleting one: how
  many were served, and the ``initialize``'s p50 below its cap and at it (the question to the
  replicas is the difference).
- ``at-cap flood``: 16 of that client's ``initialize``s at once, for ``--seconds``, against a
  cap of sessions that all serve a stream (none can end): what a bystander (another address,
  the official ``mcp`` client, one ``tools/call`` after another) sees, against ``quiet``: the
  bystander alone.

Run from the repository root (``--before REV``: the same with REV's ``src/``, a worktree)::

    .venv/bin/python bench/reconnects.py [--seconds 20] [--before REV]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import redis_server
from tests.security.test_hostile_load import HEADERS, INITIALIZE

ROOT = Path(__file__).resolve().parent.parent

CAP = 10
VERSION = INITIALIZE["params"]["protocolVersion"]
ACCEPT, HELLO = HEADERS, INITIALIZE
CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "notes__word_count", "arguments": {"text": "a b"}},
}


def config(redis_url: str) -> dict[str, Any]:
    return {
        "upstreams": {"notes": {"command": "python", "args": ["-m", "agent_gateway.demo_server"]}},
        "agent": {"enabled": False},
        "telemetry": {"metrics": False},
        "auth": {"mode": "none", "policies": {"default": {"max_sessions": CAP}}},
        "store": {"url": redis_url, "prefix": "reconnects"},
    }


def client(address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), timeout=20)


async def session(http: httpx.AsyncClient, url: str) -> tuple[dict[str, str] | None, float]:
    """A session opened and used once (its headers; None: refused), and its initialize's time."""
    started = time.perf_counter()
    answer = await http.post(url, json=HELLO, headers=ACCEPT)
    took = time.perf_counter() - started
    if answer.status_code != 200:
        return None, took
    headers = {"Mcp-Session-Id": answer.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await http.post(url, json=done, headers={**headers, **ACCEPT})
    await http.post(url, json=CALL, headers={**headers, **ACCEPT})
    return headers, took


async def reconnects(cluster: Cluster) -> str:
    served, below, at = 0, [], []
    async with client("127.0.0.2") as http:
        for n in range(60):
            headers, took = await session(http, cluster.url)
            served += headers is not None
            (below if n < CAP else at).append(took)
    return (
        f"| reconnects | {served} of 60 | {statistics.median(below) * 1e3:.1f} ms | "
        f"{statistics.median(at) * 1e3:.1f} ms | | |"
    )


async def bystander(url: str, seconds: float) -> list[float]:
    took: list[float] = []
    async with Client(url, mode="legacy") as other:  # pyright: ignore[reportArgumentType]
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await other.call_tool("notes__word_count", {"text": "a b c"})
            took.append(time.perf_counter() - started)
    return took


@asynccontextmanager
async def listening(http: httpx.AsyncClient, url: str, count: int) -> AsyncIterator[None]:
    """``count`` sessions of the client, each with its stream open (each served: none ends)."""
    async with AsyncExitStack() as stack:
        for _ in range(count):
            headers, _ = await session(http, url)
            assert headers is not None
            stream = http.stream("GET", url, headers={**headers, "Accept": "text/event-stream"})
            await stack.enter_async_context(stream)
        yield


async def flood(cluster: Cluster, seconds: float) -> tuple[str, str]:
    quiet = await bystander(cluster.url, seconds / 2)
    refused, loaded = 0, list[float]()
    async with client("127.0.0.3") as http, listening(http, cluster.url, CAP):

        async def attacker() -> None:
            nonlocal refused
            while True:
                refused += (await http.post(cluster.url, json=HELLO, headers=ACCEPT)).status_code == 429

        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(attacker)
            loaded = await bystander(cluster.url, seconds)
            tg.cancel_scope.cancel()

    def row(name: str, took: list[float], note: str) -> str:
        ordered = sorted(took)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return f"| {name} | {note} | | | {statistics.median(took) * 1e3:.1f} ms | {p99 * 1e3:.1f} ms |"

    return row("quiet", quiet, ""), row("at-cap flood", loaded, f"{refused} refused")


async def main(seconds: float) -> None:
    with redis_server() as redis, tempfile.TemporaryDirectory() as directory:
        async with replicas(config(redis.url), Path(directory)) as cluster:
            rows = [await reconnects(cluster), *await flood(cluster, seconds)]
    print("| row | served | initialize p50, below its cap | at its cap | bystander p50 | p99 |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))


def run_before(rev: str, argv: list[str]) -> None:
    """This script again, with ``rev``'s ``src/`` first on the replicas' path."""
    tree = Path(tempfile.mkdtemp(prefix="before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    try:
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        subprocess.run([sys.executable, __file__, *argv], env=env, check=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A client that reconnects without DELETE, two replicas.")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--before", help="run with this revision's src/ instead")
    args = parser.parse_args()
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    if args.before:
        run_before(args.before, ["--seconds", str(args.seconds)])
    else:
        anyio.run(main, args.seconds)
