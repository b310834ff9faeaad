"""The npm reference servers as e2e peers: eras, result text, held contexts, processes in /proc."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types
from anyio.abc import ByteReceiveStream, Process
from mcp import Client

from tests.support import NODE_MODULES, free_port, running_gateway

T = TypeVar("T")

MODES = ["legacy", "auto"]
"""The two downstream eras: the initialize handshake, and discovery (modern, stateless)."""

PROTOCOL_OF_MODE = {"legacy": "2025-11-25", "auto": "2026-07-28"}
EVERYTHING = NODE_MODULES / "@modelcontextprotocol" / "server-everything" / "dist"
FORCE_LOOPBACK = Path(__file__).with_name("force_loopback.cjs")
BOUND = 30.0
"""Upper bound for any one wait on a real peer (node start-up on a busy 2-core machine)."""


@asynccontextmanager
async def connected(url: str, mode: str) -> AsyncIterator[Client]:
    """The official client on ``url`` in ``mode``, after checking it got the era it asked for."""
    with anyio.fail_after(BOUND):
        async with Client(url, mode=mode) as client:
            assert client.protocol_version == PROTOCOL_OF_MODE[mode]
            yield client


def text_of(result: types.CallToolResult) -> str:
    """Every text block of a tool result, joined by newlines."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def tiny_image_base64() -> str:
    """The PNG that server-everything's get-tiny-image returns, read from its source."""
    source = (EVERYTHING / "tools" / "get-tiny-image.js").read_text(encoding="utf-8")
    match = re.search(r'MCP_TINY_IMAGE = "([A-Za-z0-9+/=]+)"', source)
    assert match is not None, "server-everything no longer defines MCP_TINY_IMAGE"
    return match.group(1)


async def hold(context: AbstractAsyncContextManager[T]) -> tuple[T, Callable[[], Awaitable[None]]]:
    """Enter ``context`` in a task of its own; return its value and a coroutine that exits it.

    pytest-asyncio sets a fixture up and tears it down in different tasks, and anyio's
    cancel scopes must be left by the task that entered them: one owner task does both.
    """
    entered: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    async def own() -> None:
        try:
            async with context as value:
                entered.set_result(value)
                await release.wait()
        except BaseException as exc:
            if entered.done():
                raise
            entered.set_exception(exc)

    owner = asyncio.create_task(own())
    with anyio.fail_after(BOUND * 2):
        value = await entered

    async def stop() -> None:
        release.set()
        with anyio.fail_after(BOUND):
            await owner

    return value, stop


@asynccontextmanager
async def gateway_url(upstreams: Mapping[str, Any]) -> AsyncIterator[str]:
    """The MCP URL of a gateway over ``upstreams``, for a module-scoped fixture (see ``hold``)."""
    gateway, stop = await hold(running_gateway({"upstreams": dict(upstreams)}))
    try:
        yield gateway.url
    finally:
        await stop()


def processes_with_arg(arg: str) -> set[int]:
    """Live processes with ``arg`` among their command-line arguments."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # exited while we looked
            if arg.encode() in argv:
                found.add(int(entry.name))
    return found


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name is parenthesised and may hold spaces: fields follow the last ')'.
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


async def exited(pid: int) -> None:
    """Return once process ``pid`` has terminated (a pidfd becomes readable when it does)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def command_of(pid: int) -> str:
    """The command line of ``pid`` for messages, or a note that it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"(pid {pid} gone)"


async def collect_output(
    stream: ByteReceiveStream, lines: list[str], ready: anyio.Event, marker: str
) -> None:
    """Keep a child's output drained into ``lines``; set ``ready`` when a line holds
    ``marker`` (the server listens), or when the output ends."""
    buffered = ""
    async for chunk in stream:
        buffered += chunk.decode(errors="replace")
        *complete, buffered = buffered.split("\n")
        lines.extend(complete)
        if any(marker in line for line in complete):
            ready.set()
    ready.set()


async def stop_process(process: Process) -> None:
    """Terminate ``process`` (kill it if it lingers) and close its pipes."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
        with anyio.move_on_after(5):
            await process.wait()
        if process.returncode is None:
            process.kill()
        with anyio.fail_after(5):
            await process.aclose()


@asynccontextmanager
async def everything_on_a_port(transport: str, ready_marker: str) -> AsyncIterator[int]:
    """server-everything's ``transport`` (``sse`` or ``streamableHttp``) on a free loopback
    port, once it prints ``ready_marker``; yields the port; the process is stopped on exit."""
    port = free_port()
    command = ["node", "--require", str(FORCE_LOOPBACK), str(EVERYTHING / "index.js"), transport]
    process = await anyio.open_process(
        command, env={**os.environ, "PORT": str(port)}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    lines: list[str] = []
    ready = anyio.Event()
    try:
        assert process.stderr is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect_output, process.stderr, lines, ready, ready_marker)
            with anyio.fail_after(BOUND):
                await ready.wait()
            assert any(ready_marker in line for line in lines), f"server-everything did not start: {lines}"
            yield port
            tg.cancel_scope.cancel()
    finally:
        await stop_process(process)
