"""Several replicas behind a real nginx (per-request round robin), sharing a real Redis: any
replica serves any session, a session's end is seen everywhere, a dead replica costs only its
calls in flight, limits are counted once."""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
import redis.asyncio as aioredis
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import Redis
from tests.support import initialize, serving_upstream

BOUND = 20.0
TOKENS = {"alice": "alice-token-0123456789abcdef0123", "bob": "bob-token-0123456789abcdef012345"}


def counter_server(calls: list[str]) -> FastMCP:
    """An upstream that records each call it gets, and can add a tool at run time."""
    server = FastMCP("counter")

    @server.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        calls.append(text)
        return text

    @server.tool
    async def slow(text: str, seconds: float) -> str:
        """Answer after a while."""
        calls.append(text)
        await anyio.sleep(seconds)
        calls.append(f"done {text}")
        return text

    @server.tool
    async def add_tool(name: str, ctx: Context) -> str:
        """Register a new tool (announces tools/list_changed)."""
        server.tool(lambda: name, name=name, description=f"The {name} tool.")
        await ctx.send_notification(types.ToolListChangedNotification())
        return name

    return server


def config(redis: Redis, prefix: str, upstream: str, **extra: Any) -> dict[str, Any]:
    return {
        "store": {"url": redis.url, "prefix": prefix},
        "upstreams": {"counter": {"url": upstream}},
        "agent": {"enabled": False},
        **extra,
    }


def bearer(**policies: dict[str, Any]) -> dict[str, Any]:
    """Bearer auth for alice and bob, with ``policies`` by name."""
    tokens = [
        {"name": n, "token": f"${{{n.upper()}_TOKEN}}", "policy": n if n in policies else "default"}
        for n in TOKENS
    ]
    return {"mode": "bearer", "tokens": tokens, "policies": {"default": {}, **policies}}


TOKEN_ENV = {f"{n.upper()}_TOKEN": t for n, t in TOKENS.items()}


@asynccontextmanager
async def cluster_of(
    redis: Redis, prefix: str, tmp_path: Path, calls: list[str], **extra: Any
) -> AsyncIterator[Cluster]:
    async with (
        serving_upstream(counter_server(calls)) as upstream,
        replicas(config(redis, prefix, upstream, **extra), tmp_path, env=TOKEN_ENV) as cluster,
    ):
        yield cluster


class Session:
    """A handshake-era ``mcp`` client, and the session id its server gave it."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.listening = anyio.Event()
        """Set once its notification stream (the client's GET) is open."""

    async def seen(self, response: httpx2.Response) -> None:
        self.id = response.headers.get("mcp-session-id") or self.id
        if response.request.method == "GET" and response.status_code == 200:
            self.listening.set()


@asynccontextmanager
async def session_to(
    url: str, who: str | None = None, **options: Any
) -> AsyncIterator[tuple[Client, Session]]:
    """A client of ``url`` (with ``who``'s token), and its session id once it has one."""
    session = Session()
    headers = {"Authorization": f"Bearer {TOKENS[who]}"} if who else {}
    async with (
        httpx2.AsyncClient(headers=headers, event_hooks={"response": [session.seen]}) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", **options) as client,
    ):
        yield client, session


async def raw_session(http: httpx.AsyncClient, url: str, who: str) -> str:
    """A handshake-era session of ``who`` opened and used (a ``tools/list``) with raw requests,
    no notification stream; its id."""
    own = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TOKENS[who]}"}
    answer = await http.post(url, json=initialize(who), headers=own)
    assert answer.status_code == 200, answer.text
    own |= {"Mcp-Session-Id": answer.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=done, headers=own)).status_code == 202
    listed = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=own)
    assert listed.status_code == 200
    assert "counter__echo" in listed.text, listed.text
    return own["Mcp-Session-Id"]


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_a_session_is_served_by_both_replicas_in_turn(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    calls: list[str] = []
    async with cluster_of(redis, prefix, tmp_path, calls) as cluster:
        async with session_to(cluster.url) as (client, _):
            for i in range(10):
                assert text_of(await client.call_tool("counter__echo", {"text": f"call {i}"})) == f"call {i}"
        served = [(await cluster.status(i))["calls"] for i in range(2)]
        adopted = [(await cluster.status(i))["sessions"]["adopted"] for i in range(2)]
        answered_as_json = [await json_answers(cluster, i) for i in range(2)]
    assert calls == [f"call {i}" for i in range(10)]
    # Round robin: each replica served about half of the session's calls; one opened it,
    # the other adopted it from the store (once: it then holds it).
    assert sum(served) == 10
    assert min(served) >= 3
    assert sorted(adopted) == [0, 1]
    # The adopted session is answered as the opened one is: a silent call with one JSON body.
    assert all(json >= calls for json, calls in zip(answered_as_json, served, strict=True))


async def json_answers(cluster: Cluster, replica: int) -> float:
    """Calls a replica answered with one JSON body (``agent_gateway_http_answers_total``)."""
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(f"{cluster.replicas[replica]}/metrics")).text
    found = re.search(r'^agent_gateway_http_answers_total\{form="json".*\} (\S+)$', scraped, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_session_is_adopted_only_with_the_credential_that_opened_it(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with cluster_of(redis, prefix, tmp_path, [], auth=bearer()) as cluster:
        alice = {"Authorization": f"Bearer {TOKENS['alice']}"}
        async with session_to(cluster.endpoint(0), "alice") as (client, opened):
            await client.list_tools()
            session = opened.id
            assert session is not None
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            headers = {
                "Mcp-Session-Id": session,
                "Mcp-Protocol-Version": "2025-11-25",
                "Accept": "application/json, text/event-stream",
            }
            async with httpx.AsyncClient() as http:
                bob = {"Authorization": f"Bearer {TOKENS['bob']}"}
                stolen = await http.post(cluster.endpoint(1), json=ping, headers={**headers, **bob})
                own = await http.post(cluster.endpoint(1), json=ping, headers={**headers, **alice})
    assert stolen.status_code == 404
    assert "Session not found" in stolen.text
    assert own.status_code == 200


async def test_requests_naming_another_clients_session_do_not_keep_it_alive(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # Bob names Alice's session (its id leaked) again and again: each is answered 404, and
    # none pushes its expiry back; it ends after its idle timeout without Alice's requests.
    # Alice's session is opened raw: an ``mcp`` client's GET stream is a request of Alice's,
    # and kept her session alive 11 s more (two 5 s reads timed out, a reconnect between).
    idle = 3
    async with (
        cluster_of(
            redis, prefix, tmp_path, [], auth=bearer(), server={"session_idle_timeout": idle}
        ) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
        aioredis.Redis.from_url(redis.url) as store,
    ):
        session = await raw_session(http, cluster.endpoint(0), "alice")
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {
            "Mcp-Session-Id": session,
            "Mcp-Protocol-Version": "2025-11-25",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {TOKENS['bob']}",
        }
        assert await store.exists(f"{prefix}:session:{session}")  # what Bob's requests must not keep
        with anyio.fail_after(idle + BOUND):
            while await store.exists(f"{prefix}:session:{session}"):
                for replica in (0, 1):
                    answer = await http.post(cluster.endpoint(replica), json=ping, headers=headers)
                    assert answer.status_code == 404
                await anyio.sleep(0.1)


async def test_a_session_deleted_through_one_replica_is_gone_on_the_other(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with cluster_of(redis, prefix, tmp_path, []) as cluster:
        async with session_to(cluster.endpoint(0)) as (client, opened):
            await client.list_tools()
            session = opened.id
            assert session is not None
            headers = {"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"}
            ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
            accept = {"Accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient() as http:
                # Adopted by replica 1 first, so both hold it when it is deleted.
                assert (
                    await http.post(cluster.endpoint(1), json=ping, headers={**headers, **accept})
                ).status_code == 200
        # Leaving the client sent DELETE to replica 0.
        async with httpx.AsyncClient() as http:
            with anyio.fail_after(BOUND):
                while True:
                    after = await http.post(cluster.endpoint(1), json=ping, headers={**headers, **accept})
                    if after.status_code == 404:
                        break
                    await anyio.sleep(0.05)
        status = await cluster.status(1)
    assert status["sessions"]["live"] == 0


async def test_a_rate_limit_is_enforced_once_across_replicas(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    limited = {"rate_limit": {"per_minute": 1, "burst": 8}}
    async with cluster_of(redis, prefix, tmp_path, [], auth=bearer(alice=limited)) as cluster:
        refusals: list[str] = []
        async with session_to(cluster.url, "alice") as (client, _):
            for _ in range(15):
                try:
                    await client.call_tool("counter__echo", {"text": "x"})
                except MCPError as exc:
                    refusals.append(exc.error.message)
        # A bystander is not limited by alice's bucket.
        async with session_to(cluster.url, "bob") as (other, _):
            assert text_of(await other.call_tool("counter__echo", {"text": "bob"})) == "bob"
    # A burst of 8 in all, with initialize, notifications/initialized and the client's own
    # tools/list among them: at most 6 calls. A bucket per replica would let 13 through.
    assert 15 - len(refusals) <= 6
    assert all("rate limit exceeded" in r for r in refusals)


async def test_the_live_session_cap_is_shared(redis: Redis, prefix: str, tmp_path: Path) -> None:
    capped = {"max_sessions": 3}
    async with cluster_of(redis, prefix, tmp_path, [], auth=bearer(alice=capped)) as cluster:
        async with (
            session_to(cluster.url, "alice") as (_, one),
            session_to(cluster.url, "alice") as (_, two),
            session_to(cluster.url, "alice") as (_, three),
        ):
            # Each served (its stream open): none ends for a new one (``store/room.py``).
            with anyio.fail_after(BOUND):
                for held in (one, two, three):
                    await held.listening.wait()
            with pytest.raises(Exception) as refused:  # noqa: PT011  # the SDK client's own wrapping
                async with session_to(cluster.url, "alice"):
                    pass
            async with session_to(cluster.url, "bob") as (other, _):
                assert text_of(await other.call_tool("counter__echo", {"text": "bob"})) == "bob"
        # Ended sessions no longer count: alice opens one again.
        async with session_to(cluster.url, "alice") as (again, _):
            await again.list_tools()
    assert "sessions open" in str(refused.value) or "max_sessions" in repr(refused.value)


async def warm_then_stop_mid_load(
    client: Client, calls: list[str], stop: Callable[[], object]
) -> tuple[list[str], list[str]]:
    """Calls until both replicas hold ``client``'s session, then six 1-second calls in
    flight, ``stop`` called while the upstream has them all; (answered, failed) texts."""
    for i in range(4):
        await client.call_tool("counter__echo", {"text": f"warm {i}"})
    answered: list[str] = []
    failed: list[str] = []

    async def call(text: str) -> None:
        try:
            answered.append(text_of(await client.call_tool("counter__slow", {"text": text, "seconds": 1.0})))
        except Exception:
            failed.append(text)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(call, f"slow {i}")
        with anyio.fail_after(BOUND):
            while len([c for c in calls if c.startswith("slow")]) < 6:
                await anyio.sleep(0.01)
        stop()
    return answered, failed


async def test_a_session_survives_its_replica_dying_mid_load(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    calls: list[str] = []
    async with (
        cluster_of(redis, prefix, tmp_path, calls) as cluster,
        session_to(cluster.url) as (client, _),
    ):
        _, failed = await warm_then_stop_mid_load(client, calls, lambda: cluster.kill(0))
        # The session goes on: every later call is served by the replica that is left.
        for i in range(4):
            assert text_of(await client.call_tool("counter__echo", {"text": f"after {i}"})) == f"after {i}"
        survivor = await cluster.status(1)
    # Only the calls in flight on the dead replica failed (round robin: about half).
    assert 0 < len(failed) < 6
    assert survivor["calls"] >= 4 + (6 - len(failed))


async def test_a_list_change_seen_by_one_replica_reaches_a_client_of_the_other(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    told = anyio.Event()

    async def listen(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told.set()

    async with (
        cluster_of(redis, prefix, tmp_path, []) as cluster,
        session_to(cluster.endpoint(1), message_handler=listen) as (watcher, _),
        session_to(cluster.endpoint(0)) as (changer, _),
    ):
        await watcher.list_tools()
        await changer.call_tool("counter__add_tool", {"name": "brand_new"})
        with anyio.fail_after(BOUND):
            await told.wait()
        listed = {t.name for t in (await watcher.list_tools(cache_mode="bypass")).tools}
    assert "counter__brand_new" in listed


async def test_a_replica_given_sigterm_finishes_its_calls_and_its_clients_go_on_elsewhere(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    calls: list[str] = []
    async with (
        cluster_of(redis, prefix, tmp_path, calls) as cluster,
        session_to(cluster.url) as (client, _),
        # Its notification stream stays open on replica 0: ended at SIGTERM, not waited for.
        session_to(cluster.endpoint(0)) as (listener, _),
    ):
        await listener.list_tools()
        stop = partial(cluster.processes[0].send_signal, signal.SIGTERM)
        answered, failed = await warm_then_stop_mid_load(client, calls, stop)
        # Every call in flight on the draining replica finished; the session goes on.
        for i in range(4):
            assert text_of(await client.call_tool("counter__echo", {"text": f"after {i}"})) == f"after {i}"
        exit_code = await anyio.to_thread.run_sync(cluster.processes[0].wait, BOUND)
    assert sorted(answered) == [f"slow {i}" for i in range(6)]
    assert failed == []
    assert exit_code == 0
    assert "draining" in cluster.log(0)


async def test_a_draining_replica_cuts_off_a_call_longer_than_its_drain_timeout(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    calls: list[str] = []
    async with (
        cluster_of(redis, prefix, tmp_path, calls, server={"drain_timeout": 1}) as cluster,
        session_to(cluster.endpoint(0)) as (client, _),
    ):
        failed: list[BaseException] = []
        finished_first = True

        async def long_call() -> None:
            try:
                await client.call_tool("counter__slow", {"text": "long", "seconds": 30.0})
            except Exception as exc:
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            with anyio.fail_after(BOUND):
                while "long" not in calls:
                    await anyio.sleep(0.01)
            cluster.processes[0].send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(cluster.processes[0].wait, BOUND)
            finished_first = "done long" in calls
            tg.cancel_scope.cancel()
    # The replica was gone before the upstream finished the call: drain_timeout bounds it.
    assert not finished_first
    assert "draining: the calls in flight have 1s to finish" in cluster.log(0)
