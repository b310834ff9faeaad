"""One client's requests on many connections are worked on a few at a time (``turns.py``):
a request that needs no await is otherwise worked on whole in the step that read it, one for
each of the client's connections at each turn of the event loop, ahead of every other
client's each time. Its other requests wait for a turn; every other client's do not; and a
request waiting on an upstream or a model leaves its turn to its client's next."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import FastMCP
from langchain_core.messages import AIMessage
from mcp import Client

from agent_gateway import turns
from agent_gateway.tally import http_answers
from tests.agent.scripted import ScriptedChatModel
from tests.agent.test_ask_agent import agent_gateway, ask
from tests.security.test_bytes_in_flight import until
from tests.servers import watched
from tests.support import ROOT, running_gateway, serving_upstream

PING = '{"jsonrpc": "2.0", "id": 0, "method": "ping"}'


def answered() -> int:
    """HTTP requests the gateway has answered (in this process)."""
    return sum(http_answers._totals.values())  # pyright: ignore[reportPrivateUsage]


async def test_one_clients_pings_on_many_connections_are_answered_a_few_at_a_time_around_another_clients() -> (
    None
):
    during: list[int] = []
    async with running_gateway({}) as gw, Client(gw.url, mode="legacy") as bystander:
        with flooding(gw.url, "127.0.0.2", 64, PING):
            with anyio.fail_after(60):
                while answered() < 1000:
                    await anyio.sleep(0.05)
                for _ in range(20):
                    before = answered()
                    await bystander.list_tools()
                    during.append(answered() - before - 1)
    # Four of the attacker's at each turn of the loop the bystander's listing takes, 48 in all;
    # without turns, one for each of its 64 connections at each turn: 256.
    assert statistics.median(during) < 128, sorted(during)


@contextmanager
def flooding(
    url: str, address: str, connections: int, request: str, seconds: float | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """One client's ``request`` back to back on ``connections`` connections from ``address``,
    from a process of its own (``tests/servers/flood.py``), for ``seconds`` or until the test
    is done; its output (the answers' count by status) is piped."""
    command = [
        sys.executable,
        "-m",
        "tests.servers.flood",
        url,
        str(connections),
        request,
        "--address",
        address,
    ]
    command += ["--seconds", str(seconds)] if seconds is not None else []
    child = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        yield child
    finally:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.close()
        child.kill()
        child.wait(timeout=10)
        child.stdout.close()


def held_upstream(entered: list[str], release: anyio.Event) -> FastMCP:
    server = FastMCP("held")

    @server.tool
    async def hold(tag: str) -> str:
        """Records that the call reached the upstream, then waits to be released."""
        entered.append(tag)
        await release.wait()
        return tag

    @server.resource("held://{tag}")
    async def held(tag: str) -> str:
        """The same for a read."""
        entered.append(tag)
        await release.wait()
        return tag

    return server


@pytest.mark.parametrize("kind", ["tool", "resource"])
async def test_a_clients_requests_waiting_on_an_upstream_leave_its_turns_to_its_next(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A request lets its client's working turn go while it waits on an upstream: else a
    # client with more calls or reads than turns held by a slow upstream had its next request
    # (a listing, a ping) wait until one was answered, or the turn's bound on waiting (here
    # longer than the test's).
    monkeypatch.setattr(turns, "TURN_WAIT", 60.0)
    entered: list[str] = []
    release = anyio.Event()
    held = turns.WORKING + 2

    async def one(client: Client, n: int) -> None:
        if kind == "tool":
            assert not (await client.call_tool("held__hold", {"tag": f"t{n}"})).is_error
        else:
            await client.read_resource(f"held://r{n}")

    async with (
        serving_upstream(held_upstream(entered, release)) as url,
        running_gateway({"upstreams": {"held": {"url": url}}}) as gw,
        Client(gw.url, mode="legacy") as client,
        anyio.create_task_group() as group,
    ):
        for n in range(held):
            group.start_soon(one, client, n)
        with anyio.fail_after(20):
            await until(lambda: len(entered) == held)
            listed = await client.list_tools()  # its next request, served while they wait
        assert "held__hold" in [tool.name for tool in listed.tools]
        release.set()
    assert len(entered) == held


async def test_a_clients_agent_runs_waiting_on_their_model_leave_its_turns_to_its_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same for ``ask_agent``: a run waits on its model (and its tools) for minutes.
    monkeypatch.setattr(turns, "TURN_WAIT", 60.0)
    release, asked = anyio.Event(), list[int]()
    held = turns.WORKING + 2

    async def thinking(messages: Any) -> AIMessage:
        asked.append(1)
        await release.wait()
        return AIMessage(content="thought")

    model = ScriptedChatModel(script=[thinking] * held)
    async with (
        agent_gateway(model, tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
        anyio.create_task_group() as group,
    ):
        for n in range(held):
            group.start_soon(partial(ask, client, f"think {n}", conversation_id=f"c{n}"))
        with anyio.fail_after(20):
            await until(lambda: len(asked) == held)
            listed = await client.list_tools()
        assert "ask_agent" in [tool.name for tool in listed.tools]
        release.set()
    assert len(model.seen) == held


@pytest.mark.filterwarnings("ignore:resources/subscribe:mcp.MCPDeprecationWarning")  # legacy on purpose
async def test_a_clients_subscribes_waiting_on_an_upstream_leave_its_turns_to_its_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same for ``resources/subscribe``, passed on to an upstream slow to answer it.
    monkeypatch.setattr(turns, "TURN_WAIT", 60.0)
    seen: list[tuple[str, str]] = []
    most = [0]
    held = turns.WORKING + 2
    server = watched.build(seen, subscribe_delay=60.0, most=most)
    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"w": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy") as client,
        anyio.create_task_group() as group,
    ):
        for n in range(held):
            group.start_soon(client.subscribe_resource, f"item://{n}")
        with anyio.fail_after(20):
            await until(lambda: most[0] == held)
            listed = await client.list_resource_templates()
        assert listed.resource_templates
        group.cancel_scope.cancel()  # not waited out (60 s upstream)


async def test_one_clients_notifications_on_many_connections_wait_their_turns_instead_of_piling_up() -> None:
    # The SDK answers a notification's POST 202 at once and only then hands it to the session,
    # in the same task: a client's notifications on 64 connections piled up as tasks behind its
    # session, without bound (+600 MB in 10 s). Now each takes a working turn, the rest wait.
    cancel = '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}'
    most = 0
    async with running_gateway({}) as gw, Client(gw.url, mode="legacy") as bystander:
        before = len(asyncio.all_tasks())
        with flooding(gw.url, "127.0.0.2", 64, cancel, seconds=3) as flood:
            with anyio.fail_after(60):
                while flood.poll() is None:
                    most = max(most, len(asyncio.all_tasks()))
                    await anyio.sleep(0.05)
            assert flood.stdout is not None
            accepted = int(flood.stdout.read().split()[0])
        assert (await bystander.list_tools()).tools is not None
    # About one task for each of the client's 64 connections, and its 4 turns; before,
    # hundreds more (600 in 4 s with 32 connections), one for each notification accepted.
    assert accepted > 200
    assert most - before < 100, (most - before, accepted)
