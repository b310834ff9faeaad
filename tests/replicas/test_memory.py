"""Agent memory on a real Postgres shared by the replicas: a conversation continued through the
other replica, a modern-era run paused on one and resumed on the other, compaction and
retention there as on SQLite, and replicas that set the database up at the same moment."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any, LiteralString, cast

import anyio
import httpx
import mcp_types as types
import psycopg
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from mcp import Client

from agent_gateway.agent.memory import Conversations
from agent_gateway.config import MemoryConfig
from tests.agent.model_apis import Turn, openai_api
from tests.agent.test_retention import (
    SECONDS,
    a_clients_least_recently_used_threads_past_its_bound_go,
    an_unused_thread_expires_and_a_used_one_stays,
    five_runs_compacted,
)
from tests.agent.test_rounds import WITH_TOOLS, call_round, finished, paused, unused
from tests.replicas.cluster import AGENT_GATEWAY, replicas, write_config
from tests.replicas.services import Redis, postgres_server
from tests.replicas.test_sessions import BOUND, text_of
from tests.support import free_port, gateway_env, running_gateway, serving


async def rows(database: str, query: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(database) as conn:
        return await (await conn.execute(cast(LiteralString, query))).fetchall()


async def test_replicas_setting_up_an_empty_database_together_make_it_once(database: str) -> None:
    config = MemoryConfig(store="postgres", url=database)

    async def start() -> None:
        async with Conversations(config) as conversations:
            await conversations.used("t", "someone")

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(start)
    versions = [v for (v,) in await rows(database, "SELECT v FROM checkpoint_migrations ORDER BY v")]
    assert versions == list(range(len(AsyncPostgresSaver.MIGRATIONS)))
    assert await rows(database, "SELECT thread_id FROM agent_gateway_threads") == [("t",)]


async def test_postgres_keeps_only_a_threads_latest_checkpoint(database: str) -> None:
    async with Conversations(MemoryConfig(store="postgres", url=database)) as conversations:
        texts = await five_runs_compacted(conversations)
    assert texts[-2:] == ["q4", "echo 9"]
    assert await rows(database, "SELECT count(*) FROM checkpoints WHERE thread_id = 't'") == [(1,)]
    assert await rows(database, "SELECT count(*) FROM checkpoint_writes WHERE thread_id = 't'") == [(0,)]
    # One stored value per channel, not one per step.
    (blobs,) = await rows(database, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = 't'")
    assert blobs[0] <= 3


async def test_an_unused_postgres_thread_expires_and_a_used_one_stays(database: str) -> None:
    config = MemoryConfig(store="postgres", url=database, retention_days=1.0 * SECONDS)
    await an_unused_thread_expires_and_a_used_one_stays(config)
    assert await rows(database, "SELECT thread_id FROM agent_gateway_threads") == []


async def test_a_clients_postgres_threads_past_its_bound_go(database: str) -> None:
    await a_clients_least_recently_used_threads_past_its_bound_go(
        MemoryConfig(store="postgres", url=database, max_threads=2)
    )
    assert {t for (t,) in await rows(database, "SELECT thread_id FROM agent_gateway_threads")} == {
        "a1",
        "a3",
        "b1",
        "a2",
    }


def agent_config(redis: Redis, prefix: str, database: str, **agent: Any) -> dict[str, Any]:
    return {
        "store": {"url": redis.url, "prefix": prefix},
        "server": {"state_keys": ["k" * 32]},
        "agent": {"memory": {"store": "postgres", "url": database}, **agent},
    }


async def test_a_conversation_continues_through_the_other_replica(
    redis: Redis, prefix: str, database: str, tmp_path: Path
) -> None:
    app, api = openai_api([Turn(text="Paris, in spring."), Turn(text="Yes: book the train.")])
    async with serving(app) as base:
        model = {"provider": "openai", "model": "gpt-test", "base_url": f"{base}/v1", "api_key": "test-key"}
        config = agent_config(redis, prefix, database, model=model)
        async with replicas(config, tmp_path) as cluster:
            async with Client(cluster.endpoint(0), mode="legacy") as first:
                one = await first.call_tool(
                    "ask_agent", {"query": "Where should I go?", "conversation_id": "trip"}
                )
            async with Client(cluster.endpoint(1), mode="legacy") as second:
                two = await second.call_tool(
                    "ask_agent", {"query": "Is that wise?", "conversation_id": "trip"}
                )
    assert text_of(one) == "Paris, in spring."
    assert text_of(two) == "Yes: book the train."
    sent = [m.get("content") for m in api.requests[1]["messages"]]
    # Replica 1 had the first exchange from Postgres: it sent it to the model with the new question.
    assert "Where should I go?" in sent
    assert "Paris, in spring." in sent
    assert sent[-1] == "Is that wise?"


async def test_a_modern_run_paused_on_one_replica_resumes_on_the_other(
    redis: Redis, prefix: str, database: str, tmp_path: Path
) -> None:
    question = {"query": "Hi", "conversation_id": "hello"}
    # No upstreams: the sampling request offers no tools, so the answer is one content block.
    said = types.TextContent(type="text", text="Hello from the other replica")
    reply = {"model": types.CreateMessageResult(role="assistant", content=said, model="client-model")}
    async with replicas(agent_config(redis, prefix, database), tmp_path) as cluster:
        async with Client(
            cluster.endpoint(0), mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS
        ) as client:
            first = paused(await call_round(client, question))
        async with Client(
            cluster.endpoint(1), mode="auto", sampling_callback=unused, sampling_capabilities=WITH_TOOLS
        ) as client:
            done = finished(await call_round(client, question, reply, first.request_state))
    assert text_of(done) == "Hello from the other replica"


async def test_a_replica_that_loses_postgres_is_unready_serves_on_and_recovers(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    app, _ = openai_api([Turn(text="Fine.")])
    with postgres_server() as postgres:
        async with serving(app) as base:
            model = {
                "provider": "openai",
                "model": "gpt-test",
                "base_url": f"{base}/v1",
                "api_key": "test-key",
            }
            config = agent_config(redis, prefix, postgres.url, model=model)
            async with (
                replicas(config, tmp_path, count=1) as cluster,
                Client(cluster.endpoint(0), mode="legacy") as client,
                httpx.AsyncClient() as http,
            ):
                ready = cluster.replicas[0] + "/readyz"
                postgres.stop()
                with anyio.fail_after(BOUND):
                    while (answer := await http.get(ready)).status_code != 503:
                        await anyio.sleep(0.1)
                assert "conversation memory (Postgres) does not answer" in answer.json()["problems"][0]
                failed = await client.call_tool("ask_agent", {"query": "Still there?"})
                assert failed.is_error  # at once, with why
                assert "conversation memory (Postgres) does not answer" in text_of(failed)
                assert (await client.list_tools()).tools  # what does not need Postgres is served
                postgres.start()
                with anyio.fail_after(BOUND):
                    while (await http.get(ready)).status_code != 200:
                        await anyio.sleep(0.1)
                answered = await client.call_tool("ask_agent", {"query": "And now?"})
    assert text_of(answered) == "Fine."
    log = cluster.log(0)
    assert "conversation memory postgresql://***@127.0.0.1" in log
    assert "unavailable" in log
    assert "answers again" in log
    assert "gateway-test" not in log


async def test_a_replica_that_cannot_reach_postgres_at_start_says_why_and_exits(tmp_path: Path) -> None:
    url = f"postgresql://gateway:secret-password@127.0.0.1:{free_port()}/conversations"
    path = write_config({"agent": {"memory": {"store": "postgres", "url": url}}}, tmp_path, free_port())
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [AGENT_GATEWAY, "serve", "-c", str(path)], env=gateway_env(), capture_output=True, timeout=60
        )
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 2
    assert "error: conversation memory postgresql://gateway:***@127.0.0.1" in output
    assert "cannot reach Postgres: connection failed" in output
    assert "secret-password" not in output
    assert "Traceback" not in output


async def test_two_runs_on_one_conversation_through_two_replicas_take_turns(
    redis: Redis, prefix: str, database: str, tmp_path: Path
) -> None:
    # The first run's model call is held until either the other run reaches the model too
    # (the runs overlapped: the second saw a history without the first's turn) or a while
    # has passed with it waiting for the conversation, as it must.
    release = anyio.Event()
    arrived: list[float] = []
    app, api = openai_api([Turn(text="Paris, in spring."), Turn(text="Yes: book the train.")])

    async def held(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            arrived.append(anyio.current_time())
            if len(arrived) == 1:
                with anyio.move_on_after(HOLD):
                    await release.wait()
        await app(scope, receive, send)

    async def ask(url: str, query: str, into: list[types.CallToolResult]) -> None:
        async with Client(url, mode="legacy") as client:
            into.append(await client.call_tool("ask_agent", {"query": query, "conversation_id": "trip"}))

    first: list[types.CallToolResult] = []
    second: list[types.CallToolResult] = []
    async with serving(held) as base:
        model = {"provider": "openai", "model": "gpt-test", "base_url": f"{base}/v1", "api_key": "test-key"}
        async with (
            replicas(agent_config(redis, prefix, database, model=model), tmp_path) as cluster,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(ask, cluster.endpoint(0), "Where should I go?", first)
            with anyio.fail_after(BOUND):
                while not arrived:
                    await anyio.sleep(0.02)
            tg.start_soon(ask, cluster.endpoint(1), "Is that wise?", second)
            with anyio.move_on_after(HOLD):
                while len(arrived) < 2:
                    await anyio.sleep(0.02)
            release.set()
    assert text_of(first[0]) == "Paris, in spring."
    assert text_of(second[0]) == "Yes: book the train."
    sent = [m.get("content") for m in api.requests[1]["messages"]]
    assert "Paris, in spring." in sent, "the second run began before the first had finished"
    assert sent[-1] == "Is that wise?"


HOLD = 3.0
"""Seconds the first run's model call is held while the second run must wait for it."""


async def test_a_thread_a_run_holds_on_one_replica_is_not_deleted_by_the_other_to_make_room(
    redis: Redis, prefix: str, database: str
) -> None:
    # Each replica skipped only the threads its own runs held: the other deleted a thread under
    # a run (the client's least recently used, past max_threads), and the thread that run went
    # on writing was in no table of uses: never expired, never counted, one more each time.
    release, arrived = anyio.Event(), anyio.Event()
    app, api = openai_api([Turn(text="Noted.")] * 6)
    model_calls = itertools.count(1)

    async def held(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and next(model_calls) == 2:  # the second run's model call
            arrived.set()
            with anyio.move_on_after(BOUND):
                await release.wait()
        await app(scope, receive, send)

    async def ask(url: str, query: str, conversation: str) -> types.CallToolResult:
        async with Client(url, mode="legacy") as client:
            with anyio.fail_after(BOUND):
                return await client.call_tool("ask_agent", {"query": query, "conversation_id": conversation})

    async with serving(held) as base:
        model = {"provider": "openai", "model": "gpt-test", "base_url": f"{base}/v1", "api_key": "test-key"}
        config = agent_config(redis, prefix, database, model=model)
        config["agent"]["memory"]["max_threads"] = 2
        async with running_gateway(config) as one, running_gateway(config) as two:
            await ask(one.url, "The code is 7.", "keep")
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, one.url, "Still there?", "keep")
                with anyio.fail_after(BOUND):
                    await arrived.wait()
                for i in range(3):  # through the other replica: new threads past the bound
                    await ask(two.url, f"Question {i}.", f"new-{i}")
                release.set()
            used = {t for (t,) in await rows(database, "SELECT thread_id FROM agent_gateway_threads")}
            stored = {t for (t,) in await rows(database, "SELECT DISTINCT thread_id FROM checkpoints")}
            last = await ask(one.url, "What is the code?", "keep")
    assert stored == used, "a stored thread is in no table of uses"
    assert any(t.endswith(":keep") for t in used)
    assert text_of(last) == "Noted."
    assert "The code is 7." in [m.get("content") for m in api.requests[-1]["messages"]]
