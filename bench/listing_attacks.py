"""Hostile upstream listings, and what a bystander's calls see meanwhile. One process holds the
upstreams (FastMCP, or ``tests/servers/hostile_listings.py`` over stdio), the gateway and the
clients, so the RSS figures are of all three.

- ``fat-tool``: an upstream's tool of a 60 MB description; 8 clients walk ``tools/list``
  three times each while a bystander calls another upstream's tool 10 times;
- ``fat-prompts``: 60 prompts of 1 MB descriptions (within one upstream's 64 MiB); the same
  with ``prompts/list``;
- ``loop``: an upstream whose ``nextCursor`` names its own page: how long the gateway takes
  to list it, and its templates' public URIs.

Run from the repository root, against this tree and against a baseline (a worktree of an
earlier commit), in the same session::

    PYTHONPATH=src:. .venv/bin/python bench/listing_attacks.py fat-tool
    PYTHONPATH=../base/src:. .venv/bin/python bench/listing_attacks.py fat-tool
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable

import anyio
from fastmcp import FastMCP
from mcp import Client
from tests.support import SERVERS, running_gateway, serving_upstream

Walk = Callable[[Client], Awaitable[int]]


def rss_mb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 // 2**20


async def tools(client: Client) -> int:
    count, cursor = 0, None
    while True:
        page = await client.list_tools(cursor=cursor)
        count += 1
        if not (cursor := page.next_cursor):
            return count


async def prompts(client: Client) -> int:
    count, cursor = 0, None
    while True:
        page = await client.list_prompts(cursor=cursor)
        count += 1
        if not (cursor := page.next_cursor):
            return count


async def walked_during(fat: FastMCP, walk: Walk) -> None:
    small = FastMCP("small")
    small.tool(lambda: "pong", name="ping")
    async with (
        serving_upstream(fat) as f,
        serving_upstream(small) as s,
        running_gateway({"upstreams": {"fat": {"url": f}, "small": {"url": s}}}) as gw,
    ):
        async with Client(gw.url, mode="legacy") as client:
            pages = await walk(client)
        waits: list[float] = []
        peak = rss_mb()

        async def bystander() -> None:
            async with Client(gw.url, mode="legacy") as client:
                for _ in range(10):
                    began = time.perf_counter()
                    await client.call_tool("small__ping", {})
                    waits.append(time.perf_counter() - began)

        async def lister() -> None:
            async with Client(gw.url, mode="legacy") as client:
                for _ in range(3):
                    await walk(client)

        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(lister)
            group.start_soon(bystander)
            with anyio.fail_after(300):
                while len(waits) < 10:
                    peak = max(peak, rss_mb())
                    await anyio.sleep(0.05)
            group.cancel_scope.cancel()
    waits.sort()
    print(
        f"pages a walk: {pages}; peak RSS {peak} MB; bystander p50 {waits[5] * 1000:.0f} ms, max {waits[-1] * 1000:.0f} ms"
    )


def fat_tool() -> FastMCP:
    fat = FastMCP("fat")
    fat.tool(lambda: "x", name="big", description="d" * (60 * 2**20))
    return fat


def fat_prompts() -> FastMCP:
    fat = FastMCP("fat")
    for n in range(60):
        fat.prompt(lambda: "x", name=f"big{n}", description="d" * 1_000_000)
    return fat


async def loop() -> None:
    hostile = {"command": sys.executable, "args": [str(SERVERS / "hostile_listings.py"), "loop"]}
    began = time.perf_counter()
    async with running_gateway({"upstreams": {"loop": hostile}}) as gw:
        took = time.perf_counter() - began
        publics = sorted({e.public for e in gw.gateway.catalog.snapshot.templates})
        print(
            f"listed in {took:.2f} s; template entries {len(gw.gateway.catalog.snapshot.templates)}: {publics}"
        )


async def main(scenario: str) -> None:
    if scenario == "fat-tool":
        await walked_during(fat_tool(), tools)
    elif scenario == "fat-prompts":
        await walked_during(fat_prompts(), prompts)
    else:
        await loop()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "loop")
