"""An upstream writing log lines faster than its clients read them holds a bounded number of
them in the gateway, whoever they are for, and the clients that do read still get lines.

The SDK's client starts a task for each notification an upstream sends, and each waited until
its clients took the line: 4,000 lines of 64 KB held 2,000 tasks (and their lines) at the
peak, and clients were still sent them long after the upstream had stopped. The upstream is
``tests/servers/noisy.py`` over stdio; it writes its lines on the pipe its next answer comes
on, so once that answer is in, the gateway has read every line.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import yaml
from mcp import Client
from mcp.client.session import LoggingFnT

from agent_gateway.downstream.broadcast import MAX_DATA
from tests.faults.harness import text_of
from tests.support import SERVERS, child_process, free_socket, gateway_env, ready

BOUND = 90.0
"""Against a hang: the flood took 24 s at a load average of 6 on two cores (30 s timed out once)."""
LINES = 4000
SIZE = 64_000
"""Characters a line: 256 MB in all, written faster than the clients read it."""
SPARE_TASKS = 300
"""Tasks the flood may add (a line being sent to each client, the lines passed on at once):
before, one a line still being passed on (2,000 and 1,300 in the two tests)."""
READERS = 8
NOISY = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}


@asynccontextmanager
async def most_tasks(status: Callable[[], Awaitable[int]]) -> AsyncIterator[list[int]]:
    """The most tasks ``status()`` said the gateway ran at once while inside, over those on
    the way in (the one number in the list, read once inside has ended)."""
    base = await status()
    most = [0]

    async def watch() -> None:
        while True:
            most[0] = max(most[0], await status() - base)
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        yield most
        most[0] = max(most[0], await status() - base)
        tg.cancel_scope.cancel()


@asynccontextmanager
async def noisy_gateway(tmp_path: Path) -> AsyncIterator[tuple[str, Callable[[], Awaitable[int]]]]:
    """A gateway process (its clients in another, as deployed: their reading is not the
    gateway's loop's) on two noisy upstreams: its MCP URL, and how many tasks it runs."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump({"server": {"port": port}, "upstreams": {"noisy": NOISY, "calm": NOISY}})
    )
    command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(config)]
    async with (
        child_process(command, gateway_env(), tmp_path / "gateway.log"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=BOUND) as http,
    ):
        await ready(port)

        async def tasks() -> int:
            return int((await http.get("/status")).json()["tasks"])

        yield f"http://127.0.0.1:{port}/mcp", tasks


def hearing(heard: list[str]) -> LoggingFnT:
    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))

    return on_log


async def test_lines_no_call_owns_hold_one_task_a_client_not_one_a_line(tmp_path: Path) -> None:
    heard: list[list[str]] = [[] for _ in range(READERS)]
    async with noisy_gateway(tmp_path) as (url, tasks), AsyncExitStack() as stack:
        readers = [
            await stack.enter_async_context(Client(url, mode="legacy", logging_callback=hearing(mine)))
            for mine in heard
        ]
        with anyio.fail_after(BOUND):
            async with most_tasks(tasks) as most:
                assert (
                    text_of(await readers[0].call_tool("noisy__flood", {"lines": LINES, "size": SIZE}))
                    == "flood"
                )
                with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                    await readers[0].set_logging_level("debug")  # passed on to the upstreams: the flood
                assert text_of(await readers[0].call_tool("noisy__echo", {"text": "read"})) == "read"
            assert text_of(await readers[1].call_tool("calm__echo", {"text": "bystander"})) == "bystander"
            while not all(heard):  # each client gets lines
                await anyio.sleep(0.01)
    assert most[0] < SPARE_TASKS, most


async def test_lines_of_a_call_are_passed_on_a_bounded_number_at_once(tmp_path: Path) -> None:
    heard: list[str] = []
    async with (
        noisy_gateway(tmp_path) as (url, tasks),
        Client(url, mode="legacy", logging_callback=hearing(heard)) as caller,
        Client(url, mode="legacy") as bystander,
    ):
        with anyio.fail_after(BOUND):
            async with most_tasks(tasks) as most:
                flood = {"lines": LINES, "size": SIZE, "during": True}
                assert text_of(await caller.call_tool("noisy__flood", flood)) == "flood"
            assert text_of(await bystander.call_tool("calm__echo", {"text": "bystander"})) == "bystander"
    assert heard
    assert most[0] < SPARE_TASKS, most


async def test_a_line_no_call_owns_reaches_its_listeners_cut_to_a_bounded_size(tmp_path: Path) -> None:
    # Whole, each client's queue of such lines held 16 of 4 MB each: 20 listeners that did not
    # read took the gateway from 170 to 581 MB, which it kept.
    heard: list[str] = []
    async with (
        noisy_gateway(tmp_path) as (url, _),
        Client(url, mode="legacy", logging_callback=hearing(heard)) as reader,
    ):
        assert text_of(await reader.call_tool("noisy__flood", {"lines": 2, "size": 500_000})) == "flood"
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await reader.set_logging_level("debug")  # the flood follows its answer: nobody's lines
        with anyio.fail_after(BOUND):
            while len(heard) < 2:
                await anyio.sleep(0.01)
    assert [len(line) <= MAX_DATA + 30 for line in heard] == [True, True]
    assert all(
        line.startswith(f"{n} ") and line.endswith("… (500000 characters)") for n, line in enumerate(heard)
    )
