"""The shared store itself: a dropped SSE stream resumed on the other replica, a replica that
loses Redis (ready no more, serving on, back when Redis is), one that cannot reach it at all."""

from __future__ import annotations

import json
import subprocess
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import redis.asyncio as aioredis
from fastmcp import Context, FastMCP

from agent_gateway.store.holders import HEARTBEAT_TTL
from agent_gateway.store.sessions import ENDED
from tests.replicas.cluster import AGENT_GATEWAY, Cluster, replicas, write_config
from tests.replicas.services import Redis, redis_server
from tests.replicas.test_sessions import BOUND, cluster_of, config, counter_server, session_to, text_of
from tests.servers import recorder
from tests.support import free_port, gateway_env, serving_upstream

ACCEPT = {"Accept": "application/json, text/event-stream"}
VERSION = "2025-11-25"


HELLO = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}
"""A handshake-era ``initialize``, raw."""


async def opened(http: httpx.AsyncClient, url: str, own: dict[str, str] | None = None) -> dict[str, str]:
    """A handshake-era session opened with raw requests (``own``: its client's headers, a token);
    its headers for what follows."""
    answer = await http.post(url, json=HELLO, headers={**ACCEPT, **(own or {})})
    assert answer.status_code == 200, answer.text
    headers = {"Mcp-Session-Id": answer.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    sent = {**headers, **ACCEPT, **(own or {})}
    assert (await http.post(url, json=done, headers=sent)).status_code == 202
    return headers


@asynccontextmanager
async def events(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The session's GET stream: yields an async iterator of (event id, message)."""
    async with http.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}) as stream:
        assert stream.status_code == 200

        async def read() -> AsyncIterator[tuple[str | None, dict[str, Any]]]:
            event_id: str | None = None
            async for line in stream.aiter_lines():
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:") and line[5:].strip():
                    yield event_id, json.loads(line[5:])
                    event_id = None

        yield read()


async def next_message(
    reader: AsyncIterator[tuple[str | None, dict[str, Any]]],
) -> tuple[str | None, dict[str, Any]]:
    with anyio.fail_after(BOUND):
        return await reader.__anext__()


async def stored(redis: Redis, stream: str) -> int:
    """Events Redis holds for one SSE stream."""
    async with aioredis.Redis.from_url(redis.url) as client:
        return int(await client.xlen(stream))


async def test_a_dropped_stream_resumes_on_the_other_replica_with_nothing_missed(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        cluster_of(redis, prefix, tmp_path, []) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
        session_to(cluster.endpoint(0)) as (changer, _),
    ):
        first, second = cluster.endpoint(0), cluster.endpoint(1)
        headers = await opened(http, first)
        async with events(http, first, headers) as reader:
            await changer.call_tool("counter__add_tool", {"name": "one"})
            last_id, message = await next_message(reader)
        assert message["method"] == "notifications/tools/list_changed"
        assert last_id
        stream = f"{prefix}:events:{last_id.split('/')[1]}"
        before = await stored(redis, stream)
        # Told while its stream is down: kept in Redis for it (sent after each call's answer).
        # One change at a time: two changes re-listed together are one notice.
        for count, name in enumerate(("two", "three"), start=1):
            await changer.call_tool("counter__add_tool", {"name": name})
            with anyio.fail_after(BOUND):
                while await stored(redis, stream) < before + count:
                    await anyio.sleep(0.02)
        resumed = {**headers, "Last-Event-ID": last_id}
        async with events(http, second, resumed) as reader:
            missed = [await next_message(reader), await next_message(reader)]
    assert [m["method"] for _, m in missed] == ["notifications/tools/list_changed"] * 2
    assert all(event_id and event_id != last_id for event_id, _ in missed)


UPDATED = {
    "jsonrpc": "2.0",
    "method": "notifications/resources/updated",
    "params": {"uri": "counter://value"},
}
SUBSCRIBE = {"id": 1, "method": "resources/subscribe", "params": {"uri": "counter://value"}}
BUMP = {"id": 3, "method": "tools/call", "params": {"name": "rec__bump", "arguments": {}}}


@dataclass
class RawSession:
    """A handshake-era session opened with raw requests on replica 0 of ``cluster``."""

    cluster: Cluster
    http: httpx.AsyncClient
    headers: dict[str, str]

    async def post(self, replica: int, message: dict[str, Any]) -> None:
        """One of the session's requests, to ``replica``; answered 200."""
        body = {"jsonrpc": "2.0", **message}
        endpoint = self.cluster.endpoint(replica)
        answer = await self.http.post(endpoint, json=body, headers={**self.headers, **ACCEPT})
        assert answer.status_code == 200, answer.text

    def events(self, replica: int) -> Any:
        return events(self.http, self.cluster.endpoint(replica), self.headers)


@asynccontextmanager
async def recorder_cluster(
    redis: Redis, prefix: str, tmp_path: Path, seen: list[dict[str, Any]]
) -> AsyncIterator[RawSession]:
    """Two replicas of a handshake-era recorder upstream, and a session opened on replica 0."""
    async with serving_upstream(recorder.build(seen.append)) as upstream:
        data = config(redis, prefix, upstream) | {
            "upstreams": {"rec": {"url": upstream, "protocol": "legacy"}}
        }
        async with replicas(data, tmp_path) as cluster, httpx.AsyncClient(timeout=BOUND) as http:
            yield RawSession(cluster, http, await opened(http, cluster.endpoint(0)))


async def test_a_resource_update_arising_on_one_replica_reaches_the_stream_held_by_the_other(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    # Its notification stream on replica 1; its subscription (and so the upstream's update)
    # on replica 0.
    async with recorder_cluster(redis, prefix, tmp_path, seen) as session, session.events(1) as reader:
        await session.post(0, SUBSCRIBE)
        await session.post(0, BUMP)
        event_id, message = await next_message(reader)
    assert message == UPDATED
    assert event_id  # its id in the store: a stream that drops after it resumes from it
    assert [e["uri"] for e in seen if e["event"] == "subscribe"] == ["counter://value"]


async def test_a_subscription_held_by_a_replica_that_dies_is_taken_over_by_the_other(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # The other replica adopts a session by a request (``asked``), or by its notification
    # stream alone (``alone``: a client that subscribed and then only listens: what moves when
    # its replica dies). Both on one cluster whose holder dies once (each was a test of its
    # own: two replicas started, and the dead holder's heartbeat waited out, for each).
    seen: list[dict[str, Any]] = []
    async with recorder_cluster(redis, prefix, tmp_path, seen) as asked:
        cluster, http = asked.cluster, asked.http
        alone = RawSession(cluster, http, await opened(http, cluster.endpoint(0)))
        for session in (asked, alone):
            await session.post(0, SUBSCRIBE)  # held by replica 0
        await asked.post(1, {"id": 2, "method": "tools/call", "params": {"name": "rec__whoami"}})
        async with asked.events(1) as asked_reader, alone.events(1) as alone_reader:
            readers = (asked_reader, alone_reader)
            cluster.kill(0)  # the holder dies; the streams' replica takes them over
            with anyio.fail_after(HEARTBEAT_TTL + 3 * BOUND / 4):
                told = [(await reader.__anext__())[1] for reader in readers]
            await asked.post(1, BUMP)  # an update the upstream sends replica 1 now reaches both
            updated = [(await next_message(reader))[1] for reader in readers]
    assert told == [UPDATED, UPDATED]  # "it may have changed while nobody relayed its updates"
    assert updated == [UPDATED, UPDATED]
    # Once by each replica: the gateway subscribes once per upstream session and URI.
    assert [e["uri"] for e in seen if e["event"] == "subscribe"] == ["counter://value"] * 2
    assert "subscription to counter://value taken over" in cluster.log(1)


async def test_a_replica_that_loses_redis_is_unready_serves_on_and_recovers(
    prefix: str, tmp_path: Path
) -> None:
    with redis_server() as redis:
        async with (
            serving_upstream(counter_server([])) as upstream,
            replicas(config(redis, prefix, upstream), tmp_path, count=1) as cluster,
            session_to(cluster.endpoint(0)) as (client, _),
            httpx.AsyncClient() as http,
        ):
            ready = cluster.replicas[0] + "/readyz"
            assert (await http.get(ready)).status_code == 200
            redis.stop()
            # The session goes on (its limits counted here meanwhile); readiness says why not.
            assert text_of(await client.call_tool("counter__echo", {"text": "still"})) == "still"
            with anyio.fail_after(BOUND):
                while (answer := await http.get(ready)).status_code != 503:
                    await anyio.sleep(0.1)
            problems = answer.json()["problems"]
            assert "store" in problems[0] or "Redis" in problems[0] or "Connection" in problems[0]
            assert text_of(await client.call_tool("counter__echo", {"text": "again"})) == "again"
            redis.start()
            with anyio.fail_after(BOUND):
                while (await http.get(ready)).status_code != 200:
                    await anyio.sleep(0.1)
            assert text_of(await client.call_tool("counter__echo", {"text": "back"})) == "back"
    log = cluster.log(0)
    assert "shared store" in log
    assert "unavailable" in log
    assert "answers again" in log


async def test_a_replica_that_cannot_reach_redis_at_start_says_so_and_exits(tmp_path: Path) -> None:
    url = f"redis://:secret-password@127.0.0.1:{free_port()}/0"
    path = write_config({"store": {"url": url}, "agent": {"enabled": False}}, tmp_path, free_port())
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [AGENT_GATEWAY, "serve", "-c", str(path)], env=gateway_env(), capture_output=True, timeout=60
        )
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode != 0
    assert "the shared store redis://***@127.0.0.1" in output
    assert "cannot be reached" in output
    assert "secret-password" not in output
    assert "Traceback" not in output


ROUNDS = 3


async def test_concurrent_first_requests_on_the_adopting_replica_are_all_served(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        cluster_of(redis, prefix, tmp_path, []) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        statuses: list[int] = []

        async def ping(n: int, headers: dict[str, str]) -> None:
            answer = await http.post(
                cluster.endpoint(1), json={"jsonrpc": "2.0", "id": n, "method": "ping"}, headers=headers
            )
            statuses.append(answer.status_code)

        for _ in range(ROUNDS):  # each round a new session, adopted by replica 1 under load
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            # Redis held still for a moment: the pings' lookups are answered in one burst, so
            # they reach the adoption together rather than one after another.
            async with aioredis.Redis.from_url(redis.url) as still:
                await still.client_pause(300, all=True)
            async with anyio.create_task_group() as tg:
                for n in range(40):
                    tg.start_soon(ping, n, headers)
        adopted = (await cluster.status(1))["sessions"]["adopted"]
    assert statuses == [200] * 40 * ROUNDS
    assert adopted == ROUNDS


async def test_a_session_that_only_listens_stays_adoptable_past_its_idle_timeout(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    idle = 3.0
    async with (
        cluster_of(redis, prefix, tmp_path, [], server={"session_idle_timeout": idle}) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        headers = await opened(http, cluster.endpoint(0))
        async with events(http, cluster.endpoint(0), headers):
            # No request for longer than the idle timeout: only the open stream, which keeps
            # the session alive on its replica, and so in the store for the others.
            await anyio.sleep(idle * 1.7)
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            answer = await http.post(cluster.endpoint(1), json=ping, headers={**headers, **ACCEPT})
    assert answer.status_code == 200


def echo_call(request_id: int, text: str) -> dict[str, Any]:
    arguments = {"name": "counter__echo", "arguments": {"text": text}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": arguments}


async def test_a_delete_is_answered_after_the_replicas_subscriptions_reconnected(
    prefix: str, tmp_path: Path
) -> None:
    # A replica hears its own announcement that a session ended, too. With its subscription
    # freshly reconnected (any Redis blip, or an idle-connection reaper, cuts it), that
    # announcement came back before the SDK had answered the client's DELETE: the session was
    # dropped under it, and the client was told "Session not found" for its own live session.
    with redis_server() as redis:
        async with (
            serving_upstream(counter_server([])) as upstream,
            replicas(config(redis, prefix, upstream), tmp_path) as cluster,
            httpx.AsyncClient(timeout=BOUND) as http,
        ):
            headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
            assert (
                await http.post(cluster.endpoint(1), json=echo_call(1, "a"), headers=headers)
            ).status_code == 200
            async with aioredis.Redis.from_url(redis.url) as client:
                await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                with anyio.fail_after(BOUND):  # both replicas listen again
                    while (await client.pubsub_numsub(f"{prefix}:{ENDED}"))[0][1] < 2:
                        await anyio.sleep(0.1)
            deleted = await http.delete(cluster.endpoint(1), headers=headers)
            with anyio.fail_after(BOUND):  # and the other replica hears it
                while (
                    await http.post(cluster.endpoint(0), json=echo_call(2, "b"), headers=headers)
                ).status_code != 404:
                    await anyio.sleep(0.1)
    assert deleted.status_code == 200, deleted.text


async def test_a_log_level_set_on_a_session_the_store_lost_leaves_no_key_behind(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # Redis restarted without persistence: the session's record is gone while a replica still
    # serves it. Setting its level must not make a record of one field that never expires (the
    # replica may write the whole record again, with its expiry: store/keeper.py).
    async with (
        serving_upstream(counter_server([])) as upstream,
        replicas(config(redis, prefix, upstream), tmp_path, count=1) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
        aioredis.Redis.from_url(redis.url) as client,
    ):
        headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
        session = headers["Mcp-Session-Id"]
        assert await client.delete(f"{prefix}:session:{session}") == 1
        level = {"jsonrpc": "2.0", "id": 9, "method": "logging/setLevel", "params": {"level": "debug"}}
        answer = await http.post(cluster.endpoint(0), json=level, headers=headers)
        left = {key: await client.ttl(key) async for key in client.scan_iter(f"{prefix}:session:*")}
    assert answer.status_code == 200, answer.text
    assert all(ttl > 0 for ttl in left.values()), left


def chatty_server() -> FastMCP:
    server = FastMCP("chatty")

    @server.tool
    async def chat(ctx: Context) -> str:
        """Say a line at info level, then answer."""
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await ctx.info("said at info")
        return "done"

    return server


def handshake(url: str) -> dict[str, Any]:
    """The upstream at ``url`` spoken to in the handshake era (log lines are of that era)."""
    return {"counter": {"url": url, "protocol": "legacy"}}


async def test_a_log_level_set_through_one_replica_is_applied_by_the_other_serving_the_session(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        serving_upstream(chatty_server()) as upstream,
        replicas(config(redis, prefix, upstream, upstreams=handshake(upstream)), tmp_path) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}

        async def post(replica: int, request_id: int, method: str, params: dict[str, Any]) -> str:
            request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            answer = await http.post(cluster.endpoint(replica), json=request, headers=headers)
            assert answer.status_code == 200, answer.text
            return answer.text

        await post(0, 1, "logging/setLevel", {"level": "error"})
        assert "said at info" not in await post(1, 2, "tools/call", {"name": "counter__chat"})  # adopted
        await post(0, 3, "logging/setLevel", {"level": "debug"})  # through the other replica
        with anyio.fail_after(BOUND):  # replica 1 hears it, and asks its upstream for info lines
            while "said at info" not in await post(1, 4, "tools/call", {"name": "counter__chat"}):
                await anyio.sleep(0.1)
