"""What every fault test shares: a gateway with a healthy bystander upstream and a client
calling it throughout the fault, a faulty upstream process the test controls, and the leak
check afterwards (tasks, pending calls, child processes, file descriptors).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
from mcp import Client

from agent_gateway.runtime import child_pids
from tests.support import SERVERS, RunningGateway, free_port, python_upstream, running_gateway

FAULTY = SERVERS / "faulty.py"
BOUND = 20.0


@dataclass(frozen=True)
class Baseline:
    tasks: int
    fds: int
    children: frozenset[int]

    @classmethod
    def now(cls) -> Baseline:
        return cls(len(_tasks()), _open_fds(), frozenset(child_pids()))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def wait_until(predicate: Callable[[], bool], bound: float = BOUND) -> None:
    with anyio.fail_after(bound):
        while not predicate():
            await anyio.sleep(0.02)


@asynccontextmanager
async def leak_checked() -> AsyncIterator[None]:
    """Nothing the body starts outlives it: tasks, child processes, file descriptors."""
    before = Baseline.now()
    yield
    # Bounded waits: a closed socket or a reaped child is not gone in the same instant.
    leaks = _leaks(before)
    with anyio.move_on_after(BOUND):
        while (leaks := _leaks(before)) is not None:
            await anyio.sleep(0.05)
    assert leaks is None, leaks


def _tasks() -> list[asyncio.Task[object]]:
    # sse_starlette starts one shutdown watcher per event loop, on the first SSE response,
    # that lives as long as the loop: one per process, not per request, so not a leak.
    return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ != "_shutdown_watcher"]  # type: ignore[union-attr]


def _leaks(before: Baseline) -> str | None:
    tasks = _tasks()
    if len(tasks) > before.tasks:
        return f"{len(tasks)} tasks, {before.tasks} before: {sorted(f'{t.get_name()} {t.get_coro()}' for t in tasks)}"
    if children := set(child_pids()) - before.children:
        return f"child processes left: {sorted(children)}"
    if (fds := _open_fds()) > before.fds:
        targets = sorted(_fd_target(fd) for fd in os.listdir("/proc/self/fd"))
        return f"{fds} open file descriptors, {before.fds} before: {targets}"
    return None


def _fd_target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@dataclass
class Bystander:
    """Another client calling a healthy upstream for as long as the fault lasts."""

    ok: int = 0
    failures: list[str] = field(default_factory=list)

    async def run(self, url: str, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with Client(url) as client:
            task_status.started()
            while True:
                try:
                    result = await client.call_tool("healthy__increment", {})
                except Exception as exc:  # recorded: the assertion names it
                    self.failures.append(repr(exc))
                else:
                    if result.is_error:
                        self.failures.append(text_of(result))
                    else:
                        self.ok += 1
                await anyio.sleep(0.01)


@dataclass
class Faulted:
    gw: RunningGateway
    bystander: Bystander

    @property
    def pending(self) -> int:
        return self.gw.gateway.proxy.pending()

    async def readyz(self) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.gw.base) as http:
            return await http.get("/readyz")


@asynccontextmanager
async def gateway_under_fault(upstreams: Mapping[str, Any]) -> AsyncIterator[Faulted]:
    """A gateway over ``upstreams`` plus a healthy one, with a bystander calling the healthy
    one throughout; on exit: the bystander never failed, no call is pending, nothing leaked."""
    config = {"upstreams": {**upstreams, "healthy": python_upstream("counter.py")}}
    bystander = Bystander()
    async with leak_checked():
        async with running_gateway(config) as gw, anyio.create_task_group() as tg:
            await tg.start(bystander.run, gw.url)
            faulted = Faulted(gw, bystander)
            yield faulted
            ok_before = bystander.ok
            await wait_until(lambda: bystander.ok > ok_before)  # still being served at the end
            tg.cancel_scope.cancel()
            await wait_until(lambda: faulted.pending == 0)
        assert bystander.failures == []
        assert bystander.ok > 0


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def faulty_stdio(**extra: Any) -> dict[str, Any]:
    return python_upstream("faulty.py", **extra)


class HttpProcess:
    """``faulty.py`` serving Streamable HTTP as its own process, on a port that stays the same
    across restarts (so the gateway reconnects to the same URL)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        assert self.process is None
        self.process = subprocess.Popen(
            [sys.executable, str(FAULTY), "http", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        with anyio.fail_after(BOUND):
            while not await self._listening():
                await anyio.sleep(0.02)

    async def _listening(self) -> bool:
        # Asked without blocking the loop: the gateway under test runs on it (its health
        # checks and calls would stall behind a blocking GET).
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"faulty.py http exited with {self.process.returncode}")
        try:
            async with httpx.AsyncClient() as http:
                await http.get(f"http://127.0.0.1:{self.port}/", timeout=0.5)
        except httpx.TransportError:
            return False
        return True

    async def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.process is None:
            return
        self.process.kill()
        await anyio.to_thread.run_sync(self.process.wait)
        self.process = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[HttpProcess]:
        await self.start()
        try:
            yield self
        finally:
            with anyio.CancelScope(shield=True):
                await self.kill()


async def start_together(*processes: HttpProcess) -> None:
    """Each of ``processes`` started at once: a start is mostly the interpreter importing
    FastMCP, seconds each, which several processes spend side by side."""
    async with anyio.create_task_group() as tg:
        for process in processes:
            tg.start_soon(process.start)


@asynccontextmanager
async def running_together(*processes: HttpProcess) -> AsyncIterator[None]:
    """``HttpProcess.running`` for several, started together."""
    try:
        await start_together(*processes)
        yield
    finally:
        with anyio.CancelScope(shield=True):
            for process in processes:
                await process.kill()


def _die_with_parent() -> None:
    """In the child: be killed if the test process dies first (Linux), so that a test that
    fails or is interrupted at any point leaves no server running."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): it is dead but not reaped yet.
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
