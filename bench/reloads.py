"""Configuration reloads on a running gateway: what many reloads in a row leave behind (file
descriptors, asyncio tasks, child processes) while a client calls throughout, what applying
``auth``'s policies costs a reload with sessions open, and what a reload rotating a token's
secret costs (it ends the sessions the old secret opened) against one changing nothing.

    PYTHONPATH=src python -m bench.reloads [RELOADS]   (0: the rotation only)
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack, suppress
from pathlib import Path

import anyio
import httpx
from mcp import Client
from tests.security.test_policy_reload import BYSTANDER_TOKEN, CI_TOKEN, _auth, client
from tests.security.test_token_rotation import ROTATED, UPSTREAMS
from tests.security.test_token_rotation import _auth as _rotating
from tests.test_reload import counter, from_file, write

SESSIONS = 50


def _children() -> int:
    me, count = str(os.getpid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):
            count += Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[1] == me
    return count


def _held() -> tuple[int, int, int]:
    gc.collect()
    return len(os.listdir("/proc/self/fd")), len(asyncio.all_tasks()), _children()


async def leaks(tmp: Path, reloads: int) -> None:
    path = write(tmp / "leaks.yaml", {"keep": counter(), "flip": counter()})
    shapes = [
        lambda i: {"keep": counter(), "flip": counter(env={"X": str(i)})},  # restarted
        lambda i: {"keep": counter()},  # removed
        lambda i: {"keep": counter(), "flip": counter(prefix=False)},  # added back, renamed
        lambda i: {"keep": counter(), "flip": counter()},  # renamed back
    ]
    async with from_file(path) as (gw, reloader), Client(gw.url, mode="legacy") as caller:
        calls, errors = 0, 0

        async def calling() -> None:
            nonlocal calls, errors
            while True:
                errors += (await caller.call_tool("keep__increment", {})).is_error
                calls += 1

        await reloader.reload()
        await anyio.sleep(0.5)
        before = _held()
        async with anyio.create_task_group() as tg:
            tg.start_soon(calling)
            for i in range(reloads):
                write(path, shapes[i % 4](i))
                assert await reloader.reload() is not None
            tg.cancel_scope.cancel()
        await anyio.sleep(1.0)
        print(
            f"{reloads} reloads: fds, tasks, children {before} -> {_held()}; {calls} calls, {errors} failed"
        )


async def policies(tmp: Path) -> None:
    path = write(tmp / "auth.yaml", {"keep": counter()}, auth=_auth(["*"]))
    async with from_file(path) as (gw, reloader), AsyncExitStack() as stack:
        tokens = [CI_TOKEN if i % 2 else BYSTANDER_TOKEN for i in range(SESSIONS)]
        clients = [await stack.enter_async_context(client(gw.url, t)) for t in tokens]
        for each in clients:
            await each.call_tool("keep__pid", {})
        same: list[float] = []
        changed: list[float] = []
        for i in range(5):
            started = time.perf_counter()
            await reloader.reload()
            same.append(time.perf_counter() - started)
            write(path, {"keep": counter()}, auth=_auth(["keep__pid"] if i % 2 == 0 else ["*"]))
            started = time.perf_counter()
            await reloader.reload()
            changed.append(time.perf_counter() - started)
        live = len(list(gw.gateway.sessions.live))
        refused = (await clients[1].call_tool("keep__increment", {})).is_error
        a, b = statistics.median(same) * 1000, statistics.median(changed) * 1000
        print(
            f"{SESSIONS} sessions open, {live} live after 10 reloads; the restricted client refused: {refused}"
        )
        print(f"reload p50: nothing changed {a:.1f} ms; policies changed {b:.1f} ms ({b / a:.1f}x)")


async def _listening(url: str, secret: str, stack: AsyncExitStack, tg: anyio.abc.TaskGroup) -> None:
    """A handshake-era session opened with ``secret`` over bare HTTP, its GET stream held open."""
    http = await stack.enter_async_context(httpx.AsyncClient(headers={"Authorization": f"Bearer {secret}"}))
    version = "2025-11-25"
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": version}
    hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}
    answer = await http.post(
        url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}, headers=headers
    )
    headers["mcp-session-id"] = answer.headers["mcp-session-id"]
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)

    async def hold() -> None:
        with suppress(httpx.HTTPError):
            async with http.stream("GET", url, headers={**headers, "accept": "text/event-stream"}) as stream:
                async for _ in stream.aiter_bytes():
                    pass

    tg.start_soon(hold)


async def rotation(tmp: Path) -> None:
    path = write(tmp / "rotation.yaml", UPSTREAMS, auth=_rotating(CI_TOKEN))
    secrets = [CI_TOKEN, ROTATED]
    same: list[float] = []
    rotating: list[float] = []
    ended: list[int] = []
    async with from_file(path) as (gw, reloader), anyio.create_task_group() as tg, AsyncExitStack() as stack:
        for _ in range(SESSIONS // 2):
            await stack.enter_async_context(client(gw.url, BYSTANDER_TOKEN))
        for i in range(5):
            current = secrets[i % 2]
            for _ in range(SESSIONS // 2):
                await _listening(gw.url, current, stack, tg)
            await anyio.sleep(0.2)  # their GET streams open
            live = len(gw.gateway.sessions.live)
            started = time.perf_counter()
            await reloader.reload()
            same.append(time.perf_counter() - started)
            write(path, UPSTREAMS, auth=_rotating(secrets[(i + 1) % 2]))
            started = time.perf_counter()
            await reloader.reload()
            rotating.append(time.perf_counter() - started)
            await anyio.sleep(0.5)
            ended.append(live - len(gw.gateway.sessions.live))
        tg.cancel_scope.cancel()
    a, b = statistics.median(same) * 1000, statistics.median(rotating) * 1000
    print(f"{SESSIONS} sessions open (25 of the rotated token, GET streams open): ended per rotation {ended}")
    print(f"reload p50: nothing changed {a:.1f} ms; the token rotated {b:.1f} ms ({b / a:.1f}x)")


async def main(reloads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if reloads:
            await leaks(Path(tmp), reloads)
            await policies(Path(tmp))
        await rotation(Path(tmp))


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 40)
