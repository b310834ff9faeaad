"""Clients holding an upstream's slow calls, and a bystander's calls to that upstream meanwhile.

Hogs (bearer-token clients) each keep as many calls of a slow tool in flight as their policy
lets them, retrying each refused one a second later; once they have taken what they can, a bystander makes
``--calls`` sequential calls of a quick tool of the same upstream (FastMCP, loopback
Streamable HTTP, its default ``max_concurrency`` of 200; a hog's ``max_sessions`` is raised, as each
modern-era request is a session while it runs). Each scenario runs twice in the same
process: first come, first served (``max_concurrency_per_client: 200``, which lets one client
take every slot, as before the share), and with the default share. Printed: the bystander's
calls served and their p50, against the same bystander with no hog.

    PYTHONPATH=src:. .venv/bin/python bench/upstream_share.py [--calls 200]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.security.test_upstream_load import _slow_server  # a tool that waits, and echo
from tests.support import running_gateway, serving_upstream

SCENARIOS = {
    "none": (0, 64),
    "1 hog, policy 200": (1, 200),
    "2 hogs, policy 100": (2, 100),
    "4 hogs, policy 64 (default)": (4, 64),
}
"""Hogs and each one's ``max_concurrency``."""


def _config(url: str, hogs: int, policy: int, share: int | None) -> dict[str, Any]:
    tokens = [{"name": "bystander", "token": "${B}"}]
    tokens += [{"name": f"hog{n}", "token": "${H" + str(n) + "}", "policy": "hog"} for n in range(hogs)]
    upstream: dict[str, Any] = {"url": url}
    if share is not None:
        upstream["max_concurrency_per_client"] = share
    auth = {
        "mode": "bearer",
        "tokens": tokens,
        "policies": {"hog": {"max_concurrency": policy, "max_sessions": 1000}},
    }
    return {"upstreams": {"slow": upstream}, "auth": auth}


@asynccontextmanager
async def client(url: str, token: str) -> AsyncIterator[Client]:
    """A client with as many connections as its calls (httpx's default pool holds 100)."""
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60, limits=limits) as http,
        Client(streamable_http_client(url, http_client=http)) as c,
    ):
        yield c


def _environ(hogs: int) -> dict[str, str]:
    return {"B": "bystander-token-0123456789"} | {f"H{n}": f"hog-{n}-token-0123456789" for n in range(hogs)}


async def _hog(c: Client, calls: int, release: anyio.Event) -> None:
    """``calls`` calls of ``wait`` kept in flight: each refused one is sent again a second later."""

    async def one() -> None:
        while not release.is_set():
            result = await c.call_tool("slow__wait", {})
            if not result.is_error:
                return
            await anyio.sleep(1)

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)


async def _settled(held: Any) -> None:
    """Until the upstream's calls in flight stop changing for half a second (hogs done)."""
    last, still = -1, 0.0
    with anyio.fail_after(60):
        while still < 0.5:
            await anyio.sleep(0.1)
            still = still + 0.1 if held() == last else 0.0
            last = held()


async def _bystander(c: Client, calls: int) -> list[float]:
    """The milliseconds each call served took (a refused one is not counted)."""
    waits = []
    for n in range(calls):
        began = time.perf_counter()
        result = await c.call_tool("slow__echo", {"text": str(n)})
        block = result.content[0]
        if not result.is_error and isinstance(block, types.TextContent) and block.text == str(n):
            waits.append((time.perf_counter() - began) * 1e3)
    return waits


async def scenario(hogs: int, policy: int, share: int | None, calls: int) -> tuple[list[float], int]:
    """How long each of the bystander's calls served took, and the hogs' calls held meanwhile."""
    release = anyio.Event()
    waits: list[float] = []
    held = 0
    async with (
        serving_upstream(_slow_server(release)) as url,
        running_gateway(_config(url, hogs, policy, share), environ=_environ(hogs)) as gw,
        AsyncExitStack() as stack,
    ):
        guard = gw.gateway.pool.get("slow").guard
        environ = _environ(hogs)
        bystander = await stack.enter_async_context(client(gw.url, environ["B"]))
        clients = [await stack.enter_async_context(client(gw.url, environ[f"H{n}"])) for n in range(hogs)]
        async with anyio.create_task_group() as tg:
            for hog in clients:
                tg.start_soon(_hog, hog, policy, release)
            await _settled(lambda: guard.in_flight)
            held = guard.in_flight
            waits = await _bystander(bystander, calls)
            release.set()
        return waits, held  # the hogs' calls ended with the task group


async def main(calls: int) -> None:
    print("command: PYTHONPATH=src:. .venv/bin/python bench/upstream_share.py " + shlex.join(sys.argv[1:]))
    print()
    print("| hogs | first come, first served: held, bystander served, p50 | share: held, served, p50 |")
    print("|---|---|---|")
    base = 0.0
    for name, (hogs, policy) in SCENARIOS.items():
        cells = []
        for share in (200, None):
            waits, held = await scenario(hogs, policy, share, calls)
            p50 = statistics.median(waits) if waits else 0.0
            base = base or p50
            latency = f"{p50:.1f} ms ({p50 / base:.2f}x)" if waits else "none served"
            cells.append(f"{held}; {len(waits)}/{calls} ({len(waits) / calls:.0%}); {latency}")
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200, help="the bystander's sequential calls")
    anyio.run(main, parser.parse_args().calls)
