"""``ask_agent`` under the client's bounds (issue 16, finding 11): a run is a call in flight
(``max_concurrency``), and runs per minute are bounded by the client's agent budget."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from fastmcp import FastMCP
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from mcp import Client

from agent_gateway import reload
from agent_gateway.agent.calls import _SLOTS  # pyright: ignore[reportPrivateUsage]
from agent_gateway.config import AuthConfig, ClientPolicy
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import BOUND, ask, record
from tests.agent.test_rounds import call_round, finished, paused, unused
from tests.agent.upstreams import Ran, two_upstreams
from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, bearer, client
from tests.support import RunningGateway, running_gateway, serving_upstream


def _waiting_server(release: anyio.Event, started: list[int]) -> FastMCP:
    server = FastMCP("slow")

    @server.tool
    async def wait() -> str:
        started.append(1)
        await release.wait()
        return "released"

    return server


def _respond(messages: list[BaseMessage]) -> AIMessage:
    # A run calls `wait` once, then answers: independent of how runs interleave.
    return answer("done") if isinstance(messages[-1], ToolMessage) else calls(call("slow__wait"))


@asynccontextmanager
async def agent_gateway(
    policy: dict[str, Any], release: anyio.Event, started: list[int]
) -> AsyncIterator[RunningGateway]:
    model = ScriptedChatModel(respond=_respond)
    async with serving_upstream(_waiting_server(release, started)) as url:
        config = {"upstreams": {"slow": {"url": url}}, "agent": {"memory": {"store": "memory"}}} | bearer(
            policy
        )
        environ = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
        async with running_gateway(config, environ=environ, chat_model=model) as gw:
            yield gw


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_agent_runs_count_against_the_clients_max_concurrency() -> None:
    release, started = anyio.Event(), list[int]()
    results: list[types.CallToolResult] = []
    async with (
        agent_gateway({"max_concurrency": 2}, release, started) as gw,
        client(gw.url, ATTACKER_TOKEN) as c,
    ):

        async def ask() -> None:
            results.append(await c.call_tool("ask_agent", {"query": "wait"}))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
            with anyio.fail_after(20):
                while len(results) < 3:  # three refused at once, two running
                    await anyio.sleep(0.02)
            assert all(r.is_error and "the limit (max_concurrency) is 2" in _text(r) for r in results), [
                _text(r) for r in results
            ]
            # Another client runs the agent meanwhile.
            async with client(gw.url, BYSTANDER_TOKEN) as other, anyio.create_task_group() as theirs:
                theirs.start_soon(other.call_tool, "ask_agent", {"query": "wait"})
                with anyio.fail_after(20):
                    while len(started) < 3:
                        await anyio.sleep(0.02)
                release.set()
    assert [r.is_error for r in results[3:]] == [False, False]


async def test_agent_runs_per_minute_are_bounded_per_client() -> None:
    release, started = anyio.Event(), list[int]()
    release.set()
    budget = {"agent": {"runs_per_minute": 2}}
    async with agent_gateway(budget, release, started) as gw, client(gw.url, ATTACKER_TOKEN) as c:
        outcomes = [await c.call_tool("ask_agent", {"query": "go"}) for _ in range(3)]
        assert [r.is_error for r in outcomes] == [False, False, True]
        assert "agent runs over the limit (agent.runs_per_minute)" in _text(outcomes[2])
        async with client(gw.url, BYSTANDER_TOKEN) as other:
            assert not (await other.call_tool("ask_agent", {"query": "go"})).is_error


def _waiting() -> int:
    """Calls of runs waiting for one of their client's slots."""
    return sum(slots.statistics().tasks_waiting for slots in _SLOTS.values())


def _counting_server(release: anyio.Event, running: list[int], most: list[int]) -> FastMCP:
    server = FastMCP("slow")

    @server.tool
    async def wait() -> str:
        running.append(1)
        most[0] = max(most[0], len(running))
        try:
            await release.wait()
        finally:
            running.pop()
        return "released"

    return server


async def test_one_runs_many_calls_take_at_most_the_clients_max_concurrency_at_once() -> None:
    # The model asks for 40 calls in one turn. Before, all 40 ran at once, whatever the
    # client's bound (one turn of 400 held every slot of the upstream): now 32 are run, 3 at
    # a time here, and the model is told the other 8 were not.
    release, running, most = anyio.Event(), list[int](), [0]
    replies: list[list[BaseMessage]] = []

    def respond(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            replies.append(messages)
            return answer("done")
        return calls(*[call("slow__wait") for _ in range(40)])

    model = ScriptedChatModel(respond=respond)
    async with serving_upstream(_counting_server(release, running, most)) as url:
        config = {"upstreams": {"slow": {"url": url}}, "agent": {"memory": {"store": "memory"}}} | bearer(
            {"max_concurrency": 3}
        )
        environ = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
        async with (
            running_gateway(config, environ=environ, chat_model=model) as gw,
            client(gw.url, ATTACKER_TOKEN) as c,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(c.call_tool, "ask_agent", {"query": "wait forty times"})
            with anyio.fail_after(20):  # 3 running, the other 29 waiting for one of the slots
                while len(running) < 3 or _waiting() < 29:
                    await anyio.sleep(0.02)
            release.set()
    assert most[0] == 3
    results = [m for m in replies[0] if isinstance(m, ToolMessage)]
    assert [str(m.content) for m in results].count("released") == 32
    assert sum("at most 32 tool calls of one turn" in str(m.content) for m in results) == 8


def _gated_server(gates: list[anyio.Event], running: list[int], most: list[int]) -> FastMCP:
    """``_counting_server``, each call waiting for the last of ``gates`` when it arrives."""
    server = FastMCP("slow")

    @server.tool
    async def wait() -> str:
        running.append(1)
        most[0] = max(most[0], len(running))
        try:
            await gates[-1].wait()
        finally:
            running.pop()
        return "released"

    return server


async def test_a_reload_lowering_max_concurrency_bounds_the_calls_a_clients_runs_then_have_at_once() -> None:
    # The slots a client's runs' calls share were made at its first run and kept their size:
    # after a reload lowering its max_concurrency from 3 to 1, a run still had 3 calls at the
    # upstream at once, until the gateway restarted.
    gates, running, most = [anyio.Event()], list[int](), [0]
    gates[0].set()  # the first run's calls pass at once

    def respond(messages: list[BaseMessage]) -> AIMessage:
        finished = isinstance(messages[-1], ToolMessage)
        return answer("done") if finished else calls(*[call("slow__wait") for _ in range(4)])

    model = ScriptedChatModel(respond=respond)
    async with serving_upstream(_gated_server(gates, running, most)) as url:
        config = {"upstreams": {"slow": {"url": url}}, "agent": {"memory": {"store": "memory"}}} | bearer(
            {"max_concurrency": 3}
        )
        environ = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
        async with (
            running_gateway(config, environ=environ, chat_model=model) as gw,
            client(gw.url, ATTACKER_TOKEN) as c,
        ):
            assert not (await ask(c, "first")).is_error  # its runs' slots made: 3 of them
            auth = gw.gateway.config.auth
            policies = {**auth.policies, "attacker": ClientPolicy(max_concurrency=1)}
            new = gw.gateway.config.model_copy(
                update={"auth": auth.model_copy(update={"policies": policies})}
            )
            assert (await reload.apply(gw.gateway, new)).access
            gates.append(anyio.Event())
            most[0] = 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, c, "second")
                with anyio.fail_after(20):  # each of its 4 calls at the upstream or waiting for a slot
                    while len(running) + _waiting() < 4:
                        await anyio.sleep(0.02)
                gates[-1].set()
            assert most[0] == 1
            async with client(gw.url, BYSTANDER_TOKEN) as bystander:  # served as before
                assert not (await ask(bystander, "third")).is_error


@asynccontextmanager
async def _budgeted(
    model: ScriptedChatModel, tokens_per_hour: int
) -> AsyncIterator[tuple[RunningGateway, Ran]]:
    """The agent over the test servers, every client's model tokens bounded per hour (the
    scripted model reports 10 input and 5 output tokens a turn)."""
    async with two_upstreams() as (upstreams, math, _):
        config = {
            "upstreams": upstreams,
            "agent": {"memory": {"store": "memory"}},
            "auth": {"policies": {"default": {"agent": {"tokens_per_hour": tokens_per_hour}}}},
        }
        async with running_gateway(config, chat_model=model) as gw:
            yield gw, math


async def test_a_cancelled_runs_model_tokens_count_against_the_clients_tokens_per_hour() -> None:
    # The first turn costs 15 tokens, over the budget of 10; the client cancels the run while
    # its tool call is in flight. The tokens were spent all the same: charged only when a run
    # ended, cancelling just before the end made every run free.
    model = ScriptedChatModel(script=[calls(call("math__meet", who="ann")), answer("ok"), answer("ok")])
    async with _budgeted(model, 10) as (gw, math), Client(gw.url, mode="legacy") as c:
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.call_tool, "ask_agent", {"query": "meet"})
            with anyio.fail_after(BOUND):
                while not math.calls:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        with anyio.fail_after(BOUND):
            while gw.gateway.activity.runs[-1].status == "running":
                await anyio.sleep(0.01)
        again = await ask(c, "again")
    assert again.is_error
    assert (
        _text(again)
        == "client limit: 15 model tokens in the last hour, the limit (agent.tokens_per_hour) is 10"
    )


async def test_a_paused_modern_run_is_charged_each_model_turn_once() -> None:
    # One run, two model turns of 15 tokens (30 in all), paused between them for an approval.
    # Charged each round with the run's running total, it counted 15 + 30 = 45, and the next
    # run was refused under a budget of 40 it had not used up.
    model = ScriptedChatModel(
        script=[calls(call("math__drop_table", table="a")), answer("Dropped."), answer("Next.")]
    )
    question = {"query": "Drop a."}
    yes: types.InputResponses = {"approve-0": types.ElicitResult(action="accept", content={"approve": True})}
    async with (
        _budgeted(model, 40) as (gw, math),
        Client(gw.url, mode="auto", elicitation_callback=unused) as c,
    ):
        first = paused(await call_round(c, question))
        done = finished(await call_round(c, question, yes, first.request_state))
        assert record(done)["usage"] == {"input_tokens": 20, "output_tokens": 10}
        then = finished(await call_round(c, {"query": "And now?"}))
    assert math.names() == ["drop_table"]
    assert not then.is_error, _text(then)


async def test_a_runs_model_tokens_after_a_reload_sets_a_budget_count_against_it() -> None:
    # A run in flight charged the spend it started under: one a reload gave a budget it had
    # not had charged its later turns to none, however many tokens they took. Two turns of
    # 15 tokens come after the reload, one before it: 30 is what the budget's hour holds
    # (15 would be the turn before it, taken while the client had no budget).
    release, started = anyio.Event(), list[int]()
    script = [calls(call("slow__wait")), calls(call("slow__wait")), answer("done"), answer("again")]
    model = ScriptedChatModel(script=script)
    async with serving_upstream(_waiting_server(release, started)) as url:
        config = {"upstreams": {"slow": {"url": url}}, "agent": {"memory": {"store": "memory"}}}
        async with running_gateway(config, chat_model=model) as gw, Client(gw.url, mode="legacy") as c:
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.call_tool, "ask_agent", {"query": "wait"})
                with anyio.fail_after(BOUND):
                    while not started:  # its first turn taken, unbudgeted: its tool call in flight
                        await anyio.sleep(0.01)
                budget = {"policies": {"default": {"agent": {"tokens_per_hour": 10}}}}
                new = gw.gateway.config.model_copy(update={"auth": AuthConfig.model_validate(budget)})
                assert (await reload.apply(gw.gateway, new)).access
                release.set()  # its second and third turns, 15 tokens each, taken under the budget
            again = await ask(c, "again")
    assert again.is_error
    assert (
        _text(again)
        == "client limit: 30 model tokens in the last hour, the limit (agent.tokens_per_hour) is 10"
    )


async def test_a_reload_lowering_the_budget_counts_the_tokens_already_spent() -> None:
    # 15 tokens spent under a budget of 100; a reload lowers it to 10. The hour's tokens are
    # the client's whatever its budget: a new budget that started from none made a reload
    # (or an operator's typo fixed) forgive every client its spend.
    model = ScriptedChatModel(script=[answer("one"), answer("two")])
    async with _budgeted(model, 100) as (gw, _), Client(gw.url, mode="legacy") as c:
        assert not (await ask(c, "one")).is_error
        budget = {"policies": {"default": {"agent": {"tokens_per_hour": 10}}}}
        new = gw.gateway.config.model_copy(update={"auth": AuthConfig.model_validate(budget)})
        assert (await reload.apply(gw.gateway, new)).access
        again = await ask(c, "two")
    assert again.is_error
    assert (
        _text(again)
        == "client limit: 15 model tokens in the last hour, the limit (agent.tokens_per_hour) is 10"
    )
