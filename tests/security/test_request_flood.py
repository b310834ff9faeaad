"""One client's requests on many connections are worked on a few at a time (``turns.py``):
a request that needs no await is otherwise worked on whole in the step that read it, one for
each of the client's connections at each turn of the event loop, ahead of every other
client's each time. Its other requests wait for a turn; every other client's do not; and a
request waiting on an upstream or a model leaves its turn to its client's next."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from fastmcp import FastMCP
from langchain_core.messages import AIMessage
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agent_gateway import page_budget, turns
from agent_gateway.tally import http_answers
from tests.agent.scripted import ScriptedChatModel
from tests.agent.test_ask_agent import agent_gateway, ask
from tests.security.test_bytes_in_flight import until
from tests.security.test_hostile_load import INITIALIZE
from tests.security.test_list_pages import client_with
from tests.servers import watched
from tests.support import ROOT, running_gateway, serving_upstream

PING = '{"jsonrpc": "2.0", "id": 0, "method": "ping"}'
BYSTANDER = "request-flood-bystander-0123456789"


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


async def test_one_clients_gets_on_many_connections_are_answered_a_few_at_a_time_around_another_clients() -> (
    None
):
    # A request without a body (a 404 here; /healthz, the status page, a DELETE) took no turn:
    # one for each of the attacker's connections at each turn of the loop, ahead of others'.
    async with running_gateway({}) as gw, Client(gw.url, mode="legacy") as bystander:
        with flooding(gw.url, "127.0.0.2", 64, "GET /no-such-page", counting=True) as flood:
            during = await answered_during_listings(flood, bystander)
    # Four of the attacker's at each turn of the loop; without turns, one for each connection.
    assert statistics.median(during) < 128, sorted(during)


async def test_requests_without_a_credential_on_many_connections_are_answered_a_few_at_a_time() -> None:
    # Refused (401) before they name any client, they took no turn: one for each of the
    # attacker's connections at each turn of the loop, ahead of the bystander's with a token.
    config = {"auth": {"mode": "bearer", "tokens": [{"name": "bystander", "token": BYSTANDER}]}}
    async with running_gateway(config) as gw, client_with(gw.url, BYSTANDER) as bystander:
        with flooding(gw.url, "127.0.0.2", 64, json.dumps({**INITIALIZE, "id": 0}), counting=True) as flood:
            during = await answered_during_listings(flood, bystander)
            assert flood.stdin is not None
            assert flood.stdout is not None
            flood.stdin.close()  # it stops and says what it got: every answer a 401
            assert (await anyio.to_thread.run_sync(flood.stdout.read)).split()[1:] == [b"401"]
    # Four of the attacker's at each turn of the loop; without turns, one for each connection.
    assert statistics.median(during) < 128, sorted(during)


async def test_past_the_bound_the_turns_of_addresses_without_a_credential_are_forgotten_unless_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(turns, "STRANGERS", 2)
    strangers = turns.Strangers()
    async with strangers.turn("127.0.0.2"):  # its request still in the gateway
        for address in ("127.0.0.3", "127.0.0.4", "::1"):
            async with strangers.turn(address):
                pass
        assert (len(strangers), "127.0.0.2" in strangers, "::/64" in strangers) == (2, True, True)


async def answered_during_listings(flood: subprocess.Popen[bytes], bystander: Client) -> list[int]:
    """Once the flood has had 1,000 answers: how many it had during each of 20 listings of the
    bystander's."""
    during: list[int] = []
    with anyio.fail_after(60):
        while await answered_so_far(flood) < 1000:
            await anyio.sleep(0.05)
        for _ in range(20):
            before = await answered_so_far(flood)
            await bystander.list_tools()
            during.append(await answered_so_far(flood) - before)
    return during


async def answered_so_far(flood: subprocess.Popen[bytes]) -> int:
    """The answers the flood process has got so far (it prints them on SIGUSR1)."""
    assert flood.stdout is not None
    flood.send_signal(signal.SIGUSR1)
    return int(await anyio.to_thread.run_sync(flood.stdout.readline))


@contextmanager
def flooding(
    url: str,
    address: str,
    connections: int,
    request: str,
    seconds: float | None = None,
    counting: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """One client's ``request`` back to back on ``connections`` connections from ``address``,
    from a process of its own (``tests/servers/flood.py``), for ``seconds`` or until the test
    is done; its output (the answers' count by status) is piped. ``counting``: it says how many
    it has got so far when asked (``answered_so_far``)."""
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
    command += ["--counting"] if counting else []
    child = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        if counting:  # its handler is set: it may be asked
            assert child.stdout is not None
            assert child.stdout.readline() == b"counting\n"
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


async def test_a_clients_page_refusals_held_leave_its_turns_to_its_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A refusal of a page past its client's budget is held a while (page_budget.HOLD), four of
    # a client's at once: holding their working turns, they held up its MCP requests with them.
    monkeypatch.setattr(page_budget, "HOLD", 6.0)  # held past the call's bound below
    monkeypatch.setattr(turns, "TURN_WAIT", 60.0)  # a request left waiting never ends by itself
    caplog.set_level(logging.WARNING, logger="agent_gateway.refusals")
    config = {"server": {"page_bytes_per_second": 1024}}  # one /status spends it all
    local = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with (
        running_gateway(config) as gw,
        httpx.AsyncClient(base_url=gw.base, transport=local, timeout=120) as poller,
        httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address="127.0.0.2")) as http,
        Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client,
        anyio.create_task_group() as tg,
    ):
        assert (await poller.get("/status")).status_code == 200
        for _ in range(page_budget.HELD):
            tg.start_soon(poller.get, "/status")
        with anyio.fail_after(10):
            while (
                sum("over its budget of pages" in r.getMessage() for r in caplog.records) < page_budget.HELD
            ):
                await anyio.sleep(0.05)
        with anyio.fail_after(3):
            await client.list_tools()  # its turns are free while the refusals are held
        tg.cancel_scope.cancel()
