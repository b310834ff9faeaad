"""One client's slow calls take only its share of an upstream's slots (``max_concurrency``).

Before, the slots were first come, first served across clients: a client within its own
``max_concurrency`` calling a slow tool held as many of the upstream's slots as it liked, a
second such client the rest, and every other client's call to that upstream was refused
``UpstreamBusy`` until the slow calls ended. Now a client holds at most as many as it leaves
free (or ``max_concurrency_per_client``), and its extra calls are refused naming its share.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from mcp import Client

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamRejected, UpstreamTimeout
from agent_gateway.upstreams import dedicated, queueing
from agent_gateway.upstreams.guard import Guard
from agent_gateway.upstreams.queueing import CallQueue
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.security.test_hostile_load import client
from tests.support import RunningGateway, running_gateway, serving_upstream

TOKENS = {
    "B": "bystander-token-0123456789",
    "H1": "hog-one-token-0123456789",
    "H2": "hog-two-token-0123456789",
    "N": "newcomer-token-0123456789",
}


class Upstream:
    """A slow upstream that records what reached it: ``wait`` holds until ``release``."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.waiting = 0
        self.echoed: list[tuple[str, int]] = []
        """Each ``echo`` that reached it, with the ``wait`` calls held there as it answered."""
        self.server = FastMCP("slow")
        self.server.tool(self.wait)
        self.server.tool(self.echo)

    async def wait(self) -> str:
        self.waiting += 1
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        return "released"

    def echo(self, text: str) -> str:
        self.echoed.append((text, self.waiting))
        return text


@asynccontextmanager
async def _gateway(
    upstream: Upstream, model: ScriptedChatModel | None = None, **limits: Any
) -> AsyncIterator[tuple[RunningGateway, list[Client]]]:
    """The upstream behind a gateway with bearer auth; clients bystander, hog one, hog two."""
    async with serving_upstream(upstream.server) as url:
        config = {
            "upstreams": {"slow": {"url": url, **limits}},
            "auth": {
                "mode": "bearer",
                "tokens": [{"name": n, "token": "${" + var + "}"} for n, var in _ALL.items()],
            },
            "agent": {"memory": {"store": "memory"}},
        }
        async with (
            running_gateway(config, environ=TOKENS, chat_model=model) as gw,
            AsyncExitStack() as stack,
        ):
            clients = [
                await stack.enter_async_context(client(gw.url, TOKENS[var])) for var in _NAMES.values()
            ]
            yield gw, clients


_NAMES = {"bystander": "B", "hog1": "H1", "hog2": "H2"}
"""The clients each test is given."""
_ALL = _NAMES | {"newcomer": "N"}


@pytest.fixture(autouse=True)
def _turns_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count slots, not turns: this upstream serves in the gateway's own process,
    so on a loaded machine its pings came back late, the window narrowed, and the calls it
    held back waited for a turn instead of meeting the share they test (a run with three
    workers). A ping must now be a second late to narrow it (``test_upstream_turns.py``)."""
    monkeypatch.setattr(queueing, "TARGET", 1.0)


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def _hog(hog: Client, calls: int, into: list[str], tg: anyio.abc.TaskGroup) -> None:
    async def call() -> None:
        into.append(_text(await hog.call_tool("slow__wait", {})))

    for _ in range(calls):
        tg.start_soon(call)


async def _settled(guard: Guard, sent: int, *outcomes: list[str]) -> None:
    """Until each of the ``sent`` calls is in flight upstream or has its outcome."""
    with anyio.fail_after(20):
        while guard.in_flight + sum(map(len, outcomes)) < sent:
            await anyio.sleep(0.02)


async def _until_waiting(queue: CallQueue, calls: int) -> None:
    """Until ``calls`` wait for their turn at the upstream."""
    with anyio.fail_after(20):
        while queue.waiting < calls:
            await anyio.sleep(0.02)


async def _arrived(upstream: Upstream, calls: int) -> None:
    """Until ``calls`` of ``wait`` are held at the upstream itself."""
    with anyio.fail_after(20):
        while upstream.waiting < calls:
            await anyio.sleep(0.02)


async def test_a_bystanders_call_is_served_while_two_clients_hold_an_upstreams_slow_calls() -> None:
    upstream = Upstream()
    async with _gateway(upstream, max_concurrency=10) as (gw, (bystander, hog1, hog2)):
        guard = gw.gateway.pool.get("slow").guard
        first: list[str] = []
        second: list[str] = []
        async with anyio.create_task_group() as tg:
            await _hog(hog1, 20, first, tg)  # within its own max_concurrency (64)
            await _settled(guard, 20, first)
            await _hog(hog2, 20, second, tg)
            await _settled(guard, 40, first, second)
            await _arrived(upstream, guard.in_flight)
            assert _text(await bystander.call_tool("slow__echo", {"text": "served"})) == "served"
            assert upstream.echoed == [("served", 8)]  # it reached the upstream during the hold
            # Half the slots, then half of the rest: two left free for everyone else.
            assert guard.held == {"hog1": 5, "hog2": 3}
            assert (
                first
                == [
                    "upstream 'slow': client 'hog1' has 5 calls in flight here, and 5 of the upstream's 10 "
                    "(max_concurrency) are free: a client's share is as many as it leaves free. Its share is "
                    "full, not the upstream (other clients' calls are served); retry once some of its calls end"
                ]
                * 15
            )
            assert len(second) == 17
            assert all("client 'hog2' has 3 calls in flight here" in t for t in second)
            upstream.release.set()
    assert first.count("released") == 5
    assert second.count("released") == 3
    assert guard.held == {}  # a client's entry goes with its last call
    assert guard.in_flight == 0


async def test_a_fixed_share_bounds_each_client_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    upstream = Upstream()
    async with _gateway(upstream, max_concurrency=10, max_concurrency_per_client=3) as (gw, clients):
        bystander, hog1, _ = clients
        guard = gw.gateway.pool.get("slow").guard
        refused: list[str] = []
        async with anyio.create_task_group() as tg:
            await _hog(hog1, 8, refused, tg)
            await _settled(guard, 8, refused)
            await _arrived(upstream, guard.in_flight)
            assert _text(await bystander.call_tool("slow__echo", {"text": "served"})) == "served"
            assert upstream.echoed == [("served", 3)]
            assert guard.held == {"hog1": 3}
            assert (
                refused
                == [
                    "upstream 'slow': client 'hog1' has 3 calls in flight here, its share "
                    "(max_concurrency_per_client) is 3. Its share is full, not the upstream (other clients' "
                    "calls are served); retry once some of its calls end"
                ]
                * 5
            )
            upstream.release.set()
    assert guard.held == {}
    logged = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.refusals"]
    assert "client hog1 holds its share of upstream slow's calls: 3 in flight there, its share " in logged[0]


@pytest.mark.parametrize("session", ["shared", "per_client"])
async def test_a_client_arriving_at_a_full_upstream_waits_for_the_next_slot_and_is_served(
    session: str,
) -> None:
    # Before, a call past max_concurrency was refused at once, whoever sent it: clients each
    # holding their share, and sending again as their calls ended, kept the upstream full,
    # and a client arriving was refused however short their calls were. Dedicated sessions'
    # calls (per_client) were still refused so after the shared session's waited: one queue
    # per upstream now serves both.
    upstream = Upstream()
    async with _gateway(upstream, max_concurrency=2, session=session) as (gw, (bystander, hog1, hog2)):
        shared = gw.gateway.pool.get("slow")
        queue = shared.queue
        refused: list[str] = []
        served: list[str] = []

        async def bystanders_call() -> None:
            served.append(_text(await bystander.call_tool("slow__echo", {"text": "served"})))

        async with anyio.create_task_group() as tg:
            await _hog(hog1, 2, refused, tg)  # one held, one refused: as many as it leaves free
            await _settled(shared.guard, 2, refused)
            await _hog(hog2, 1, refused, tg)
            await _arrived(upstream, 2)  # full
            tg.start_soon(bystanders_call)
            with anyio.fail_after(20):
                while queue.waiting < 1:
                    await anyio.sleep(0.02)
            again = await hog2.call_tool("slow__wait", {})  # a greedy client meanwhile: refused
            assert _text(again) == (
                "upstream 'slow': 2 calls in flight, the limit (max_concurrency) is 2; a client with "
                "calls in flight or waiting here is refused, one with none waits for the next slot"
            )
            assert served == []
            assert upstream.echoed == []
            upstream.release.set()  # the held calls end: the next slot is the bystander's
        assert served == ["served"]
        assert [text for text, _ in upstream.echoed] == ["served"]  # it reached the upstream
        assert refused.count("released") == 2


async def test_a_dedicated_session_whose_call_waits_its_turn_is_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A call waiting for its turn is no call in flight: its dedicated session looked idle, a
    # new client's session (max_sessions full) took its place, and the waiting call failed
    # "not connected" while the newcomer was served ahead of it.
    monkeypatch.setattr(dedicated, "_IDLE", 0.0)  # any session without a call would be idle
    upstream = Upstream()
    limits = {"max_concurrency": 2, "session": "per_client", "max_sessions": 3, "max_sessions_per_client": 3}
    async with _gateway(upstream, **limits) as (gw, (bystander, hog1, hog2)):
        shared = gw.gateway.pool.get("slow")
        refused: list[str] = []
        served: list[str] = []

        async def bystanders_call() -> None:
            served.append(_text(await bystander.call_tool("slow__echo", {"text": "served"})))

        async with anyio.create_task_group() as tg:
            await _hog(hog1, 1, refused, tg)
            await _hog(hog2, 1, refused, tg)
            await _arrived(upstream, 2)  # full, and three sessions open with the bystander's
            tg.start_soon(bystanders_call)
            await _until_waiting(shared.queue, 1)
            async with client(gw.url, TOKENS["N"]) as newcomer:
                again = await newcomer.call_tool("slow__echo", {"text": "new"})
            assert again.is_error
            assert "3 sessions (max_sessions) are in use" in _text(again)
            upstream.release.set()
        assert served == ["served"]
        assert [text for text, _ in upstream.echoed] == ["served"]


async def test_a_guard_keeps_no_entry_for_a_client_without_a_call_in_flight() -> None:
    # Thousands of clients, one call each, ended every way a call ends: the per-client counts
    # stay as many as the calls in flight, so many clients cost nothing once they are gone.
    guard = Guard("u", UpstreamConfig(url="http://u/mcp", max_concurrency=4))
    cancelled = anyio.get_cancelled_exc_class()
    outcomes = [None, UpstreamTimeout("u", "late"), UpstreamRejected("u", "no", -32600), cancelled()]
    for n in range(4000):
        with contextlib.suppress(UpstreamTimeout, UpstreamRejected, cancelled), guard.admitted(f"client-{n}"):
            assert guard.held == {f"client-{n}": 1}
            if (outcome := outcomes[n % 4]) is not None:
                raise outcome
    assert guard.held == {}
    assert guard.in_flight == 0


async def test_an_agent_runs_calls_take_its_clients_share() -> None:
    # One turn asks for 20 slow calls: they are the run's client's, so they take its share
    # (5 of 10), not every slot, and the model reads the refusals of the other 15.
    upstream = Upstream()
    told: list[str] = []

    def respond(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            told.extend(str(m.content) for m in messages if isinstance(m, ToolMessage))
            return answer("done")
        return calls(*[call("slow__wait") for _ in range(20)])

    model = ScriptedChatModel(respond=respond)
    async with _gateway(upstream, model, max_concurrency=10) as (gw, (bystander, hog1, _)):
        guard = gw.gateway.pool.get("slow").guard
        async with anyio.create_task_group() as tg:
            tg.start_soon(hog1.call_tool, "ask_agent", {"query": "wait twenty times"})
            await _arrived(upstream, 5)
            assert _text(await bystander.call_tool("slow__echo", {"text": "served"})) == "served"
            assert upstream.echoed == [("served", 5)]
            assert guard.held == {"hog1": 5}
            upstream.release.set()
    assert told.count("released") == 5
    assert sum("client 'hog1' has 5 calls in flight here" in t for t in told) == 15
