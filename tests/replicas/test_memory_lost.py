"""Agent memory's Postgres lost in the middle of a run: the run fails with one clear line, other
clients are served meanwhile, and runs work again once Postgres is back."""

from __future__ import annotations

import logging

import anyio
import mcp_types as types
import pytest
from langchain_core.messages import AIMessage, BaseMessage
from mcp import Client

from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import record, text
from tests.agent.upstreams import two_upstreams
from tests.replicas.services import postgres_server
from tests.support import running_gateway

BOUND = 60.0
"""Seconds the test waits at most for any one step (a Postgres stop and start included)."""


async def test_a_run_that_loses_postgres_midway_fails_in_one_line_and_the_gateway_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    lost = anyio.Event()
    outcome: list[types.CallToolResult] = []
    served: list[types.CallToolResult] = []
    with postgres_server() as postgres:

        async def loses_memory(_: list[BaseMessage]) -> AIMessage:
            # The model's turn is the moment the database goes: its step cannot be stored.
            await anyio.to_thread.run_sync(postgres.stop)
            lost.set()
            return calls(call("math__add", a=1, b=2))

        model = ScriptedChatModel(script=[loses_memory, answer("Memory is back.")])
        async with two_upstreams() as (upstreams, _, _):
            memory = {"store": "postgres", "url": postgres.url}
            config = {"upstreams": upstreams, "agent": {"memory": memory}}
            async with (
                running_gateway(config, chat_model=model) as gw,
                Client(gw.url, mode="legacy") as client,
                Client(gw.url, mode="legacy") as bystander,
            ):

                async def asks() -> None:
                    with anyio.fail_after(BOUND):
                        outcome.append(await client.call_tool("ask_agent", {"query": "Add 1 and 2."}))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(asks)
                    with anyio.fail_after(BOUND):
                        await lost.wait()
                    while not outcome:  # the bystander's plain calls, all the while the run fails
                        with anyio.fail_after(BOUND / 4):
                            served.append(await bystander.call_tool("math__add", {"a": 2, "b": 3}))
                await anyio.to_thread.run_sync(postgres.start)
                agent = gw.gateway.agent
                assert agent is not None
                with anyio.fail_after(BOUND):
                    while agent.memory_problem is not None or not await answers(postgres.url):
                        await anyio.sleep(0.1)
                with anyio.fail_after(BOUND):
                    again = await client.call_tool("ask_agent", {"query": "Are you back?"})
    (failed,) = outcome
    assert failed.is_error
    assert "conversation memory (Postgres) is unavailable" in text(failed), text(failed)
    assert "\n" not in text(failed)
    assert record(failed)["error"] is not None
    assert served
    assert all(not s.is_error for s in served)
    assert not again.is_error, text(again)
    assert text(again) == "Memory is back."
    agent = [r for r in caplog.records if r.name.startswith("agent_gateway.agent")]
    assert [r.getMessage() for r in agent if r.exc_info] == []  # no traceback: not a bug
    runner = [r for r in agent if r.name == "agent_gateway.agent.runner"]
    assert [r.getMessage() for r in runner if r.levelno >= logging.ERROR] == []
    said = [r.getMessage() for r in runner if r.levelno == logging.WARNING and "failed:" in r.getMessage()]
    assert len(said) == 1, said
    assert "conversation memory (Postgres) is unavailable" in said[0]


async def answers(url: str) -> bool:
    """Whether Postgres at ``url`` takes a connection now."""
    import psycopg

    try:
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False
