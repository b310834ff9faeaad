"""Faults around a held call's rounds across replicas (``store/rounds.py``): a malformed or
repeated message on a replica's channel (a bug in another replica), the store going away
during a round, an outcome that never comes, a holder's malformed line. None may take a
replica down, and no round may wait for ever.

The replicas are ``agent-gateway serve`` processes on a real Redis; where a holder must
misbehave, it is a peer scripted on a raw Redis connection, speaking the rounds' messages
(``store/round_messages.py``) to this process's ``Rounds`` as another replica would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
import redis.asyncio as aioredis
from fastmcp import Context, FastMCP

from agent_gateway.config import GatewayConfig
from agent_gateway.config_store import StoreConfig
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.held_calls import HeldCalls
from agent_gateway.downstream.held_rounds import Elsewhere
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.errors import ReplicaError, StoreUnavailable, UnknownRound
from agent_gateway.store import rounds as rounds_module
from agent_gateway.store.rounds import Rounds
from agent_gateway.store.state import SharedState
from tests.replicas.cluster import replicas
from tests.replicas.services import Redis, redis_server
from tests.replicas.test_held_rounds import (
    BOUND,
    TOKEN_ENV,
    accepting,
    alice_on_both,
    config,
    first_round,
    modern,
    text_of,
    until_logged,
)
from tests.replicas.test_sessions import config as counter_config
from tests.replicas.test_sessions import counter_server, session_to
from tests.support import serving_upstream

HOLDER = "holder"
ELSEWHERE = Elsewhere(HOLDER, f"{HOLDER}.secret", "asker__ask")


async def round_channels(redis: Redis, prefix: str) -> list[str]:
    """Each live replica's rounds channel, from their heartbeats."""
    client = aioredis.from_url(redis.url)
    try:
        keys = await client.keys(f"{prefix}:replica:*")
        names = [key.decode() if isinstance(key, bytes) else key for key in keys]
        return [f"{prefix}:rounds:{name.rsplit(':', 1)[1]}" for name in names]
    finally:
        await client.aclose()


async def test_malformed_and_repeated_round_messages_are_dropped_and_the_replicas_serve_on(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    answered: list[str] = []
    async with alice_on_both(redis, prefix, tmp_path, answered) as (cluster, _, on_0, on_1):
        with anyio.fail_after(BOUND):  # each replica's heartbeat, written by a task of its own
            while len(channels := await round_channels(redis, prefix)) < 2:
                await anyio.sleep(0.05)
        assert len(channels) == 2
        other = channels[1].rsplit(":", 1)[1]
        twice = {
            "op": "round",
            "id": "0123456789abcdef",
            "sender": other,
            "token": "no.such",
            "tool": "t",
            "client": "x",
        }
        raw = aioredis.from_url(redis.url)
        try:
            for channel in channels:
                for said in ("not json", json.dumps({"op": "round", "tool": "x"}), json.dumps([1, 2])):
                    assert await raw.publish(channel, said) == 1
            for _ in range(2):
                assert await raw.publish(channels[0], json.dumps(twice)) == 1
        finally:
            await raw.aclose()
        # Both still serve a held call across them, and said why they dropped what they did.
        state, key = await first_round(on_0)
        with anyio.fail_after(BOUND):
            done = await on_1.session.call_tool(
                "asker__ask", {}, input_responses={key: accepting("ada")}, request_state=state
            )
        assert text_of(done) == "hello ada"
        assert [process.poll() for process in cluster.processes] == [None, None]
        logs = cluster.log(0) + cluster.log(1)
        assert logs.count("a message dropped, not understood") == 6
        assert "Traceback" not in logs


def asking_then_pausing() -> FastMCP:
    server = FastMCP("asker")

    @server.tool
    async def ask(ctx: Context) -> str:
        """Ask, then take two seconds over the answer."""
        await ctx.elicit("name?", response_type=str)
        await anyio.sleep(2)
        return "done"

    return server


async def test_the_store_going_away_during_a_round_leaves_the_holder_serving(tmp_path: Path) -> None:
    with redis_server() as private:
        async with (
            serving_upstream(asking_then_pausing()) as upstream,
            replicas(config(private, "down", upstream), tmp_path, env=TOKEN_ENV) as cluster,
            AsyncExitStack() as stack,
        ):
            on_0 = await modern(stack, cluster.endpoint(0), "alice")
            on_1 = await modern(stack, cluster.endpoint(1), "alice")
            state, key = await first_round(on_0)
            outcome: list[str] = []

            async def retry() -> None:
                result = await on_1.session.call_tool(
                    "asker__ask", {}, input_responses={key: accepting("x")}, request_state=state
                )
                outcome.append(text_of(result))

            async with anyio.create_task_group() as tg:
                tg.start_soon(retry)
                await until_logged(cluster, 0, "serving a round for replica")
                private.stop()  # while its upstream works on the answer
                with anyio.fail_after(BOUND):
                    while not outcome:
                        await anyio.sleep(0.05)
            # The round ended on the asking side (its holder fell silent); the holder lived on.
            assert "is not held here" in outcome[0]
            await until_logged(cluster, 0, "its round's outcome not sent back")
            assert cluster.processes[0].poll() is None
            assert "Traceback" not in cluster.log(0)


async def test_an_upstreams_list_change_while_the_store_is_away_is_still_applied(
    prefix: str, tmp_path: Path
) -> None:
    """The change is announced to the other replicas on the store; that failing must not fail
    the upstream (its session was reopened when the announcement raised)."""
    with redis_server() as private:
        async with (
            serving_upstream(counter_server([])) as upstream,
            replicas(counter_config(private, prefix, upstream), tmp_path, count=1) as cluster,
            session_to(cluster.endpoint(0)) as (client, _),
            httpx.AsyncClient() as http,
        ):
            private.stop()
            with anyio.fail_after(BOUND):
                while (await http.get(f"{cluster.replicas[0]}/readyz")).status_code != 503:
                    await anyio.sleep(0.05)
            await client.call_tool("counter__add_tool", {"name": "one"})
            with anyio.fail_after(BOUND):
                while "counter__one" not in {
                    t.name for t in (await client.list_tools(cache_mode="bypass")).tools
                }:
                    await anyio.sleep(0.05)
            log = cluster.log(0)
    assert "upstream counter is down" not in log
    assert "Traceback" not in log


# -- a scripted holder on a raw Redis connection ---------------------------------------------------

Script = Callable[[aioredis.Redis, str, dict[str, Any]], Awaitable[None]]


@asynccontextmanager
async def scripted_holder(url: str, prefix: str, script: Script) -> AsyncIterator[Rounds]:
    """This process's ``Rounds`` (the asking replica), and a holder that hears its rounds and
    answers as ``script`` does."""
    shared = SharedState(GatewayConfig(), StoreConfig(url=url, prefix=prefix, timeout=0.5))
    rounds = Rounds(shared, HeldCalls())
    raw = aioredis.from_url(url)
    await raw.set(f"{prefix}:replica:{HOLDER}", "1", ex=60)  # its heartbeat: it lives
    pubsub = raw.pubsub()
    await pubsub.subscribe(f"{prefix}:rounds:{HOLDER}")

    async def hold() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message" and (asked := json.loads(message["data"]))["op"] == "round":
                await script(raw, f"{prefix}:rounds:{asked['sender']}", asked)

    try:
        async with shared.running(), anyio.create_task_group() as tg:
            tg.start_soon(hold)
            yield rounds
            tg.cancel_scope.cancel()
    finally:
        await pubsub.aclose()
        await raw.aclose()


def caller() -> Caller:
    """A retry's request with no channel of its own: what reaches it is not under test here."""
    session = DownstreamSession("s", "modern", "http", None)
    return Caller(session=session, server_session=None, request_id=None)  # pyright: ignore[reportArgumentType]


async def silent(raw: aioredis.Redis, back: str, asked: dict[str, Any]) -> None:
    """Hears the round, then says nothing: its outcome lost on the way."""


async def malformed_then_failed(raw: aioredis.Redis, back: str, asked: dict[str, Any]) -> None:
    await raw.publish(back, json.dumps({"op": "progress", "id": asked["id"], "progress": "half"}))
    await raw.publish(
        back, json.dumps({"op": "error", "id": asked["id"], "code": -32602, "message": "its own"})
    )


async def test_a_round_whose_holder_falls_silent_ends_and_is_cancelled_there(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rounds_module, "_SILENCE", 1.0)  # the ending is tested, not its 6 s
    async with scripted_holder(redis.url, prefix, silent) as rounds:
        with anyio.fail_after(BOUND), pytest.raises(UnknownRound):
            await rounds.round(ELSEWHERE, caller())
        assert not rounds._waiting  # pyright: ignore[reportPrivateUsage]


async def test_a_holders_malformed_line_is_dropped_and_its_outcome_still_taken(
    redis: Redis, prefix: str
) -> None:
    async with scripted_holder(redis.url, prefix, malformed_then_failed) as rounds:
        with anyio.fail_after(BOUND), pytest.raises(ReplicaError, match="its own") as raised:
            await rounds.round(ELSEWHERE, caller())
    assert raised.value.code == types.INVALID_PARAMS


async def test_a_round_with_the_store_away_is_refused_with_the_reason(prefix: str) -> None:
    with redis_server() as private:
        async with scripted_holder(private.url, prefix, silent) as rounds:
            private.stop()
            with (
                anyio.fail_after(BOUND),
                pytest.raises(StoreUnavailable, match="the shared store cannot be reached"),
            ):
                await rounds.round(ELSEWHERE, caller())
