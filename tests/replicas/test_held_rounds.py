"""A modern client's held call (``downstream/held_calls.py``) answered through another replica
(``store/rounds.py``): two ``agent-gateway serve`` processes sharing a real Redis, each with
its own session to one handshake-era upstream that asks (elicitation), records what it is
answered, then reports progress and a log line. The client is the official ``mcp`` client in
the modern era, sending each round to the replica the test picks, as a balancer might.
"""

from __future__ import annotations

import signal
import warnings
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.otlp import SpanSeen, otlp_receiver
from tests.replicas.cluster import Cluster, replicas
from tests.replicas.services import Redis
from tests.support import serving_upstream

BOUND = 20.0
TOKENS = {"alice": "alice-token-0123456789abcdef0123", "bob": "bob-token-0123456789abcdef012345"}
TOKEN_ENV = {f"{n.upper()}_TOKEN": t for n, t in TOKENS.items()}
STATE_KEY = "held-rounds-test-key-0123456789abcdef"


def asking_server(answered: list[str]) -> FastMCP:
    server = FastMCP("asker")

    @server.tool
    async def ask(ctx: Context) -> str:
        """Ask for a name; report progress and log a line once answered."""
        answer = await ctx.elicit("name?", response_type=str)
        name = getattr(answer, "data", "")
        answered.append(name)
        await ctx.report_progress(1, 2, f"named {name}")
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await ctx.info(f"working for {name}")
        return f"hello {name}"

    @server.tool
    async def ask_twice(ctx: Context) -> str:
        """Ask for a first name, then for a last name."""
        first = await ctx.elicit("first name?", response_type=str)
        last = await ctx.elicit("last name?", response_type=str)
        return f"hello {getattr(first, 'data', '')} {getattr(last, 'data', '')}"

    @server.tool
    async def ask_then_wait(ctx: Context) -> str:
        """Ask, then wait until cancelled."""
        await ctx.elicit("name?", response_type=str)
        answered.append("waiting")
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            answered.append("cancelled")
            raise
        return "never"

    return server


def config(redis: Redis, prefix: str, upstream: str, **extra: Any) -> dict[str, Any]:
    tokens = [{"name": n, "token": f"${{{n.upper()}_TOKEN}}"} for n in TOKENS]
    return extra | {
        "store": {"url": redis.url, "prefix": prefix},
        # Both replicas seal requestState with the same key, so either may unseal the other's.
        "server": {"state_keys": [STATE_KEY]},
        "upstreams": {"asker": {"url": upstream, "protocol": "legacy"}},
        "auth": {"mode": "bearer", "tokens": tokens, "policies": {"default": {}}},
        "agent": {"enabled": False},
    }


@asynccontextmanager
async def cluster_of(
    redis: Redis, prefix: str, tmp_path: Path, answered: list[str], **extra: Any
) -> AsyncIterator[Cluster]:
    async with (
        serving_upstream(asking_server(answered)) as upstream,
        replicas(config(redis, prefix, upstream, **extra), tmp_path, env=TOKEN_ENV) as cluster,
    ):
        yield cluster


class Heard:
    """What reached the client while its rounds were served: progress and log lines."""

    def __init__(self) -> None:
        self.progress: list[tuple[float, float | None, str | None]] = []
        self.logs: list[Any] = []

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message))

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params.data)


async def unused(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("the test answers each round itself")


async def modern(stack: AsyncExitStack, url: str, who: str, heard: Heard | None = None) -> Client:
    http = await stack.enter_async_context(
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS[who]}"}, timeout=BOUND)
    )
    transport = streamable_http_client(url, http_client=http)
    on_log = heard.on_log if heard is not None else None
    return await stack.enter_async_context(
        Client(transport, mode="auto", elicitation_callback=unused, logging_callback=on_log)
    )


@asynccontextmanager
async def alice_on_both(
    redis: Redis, prefix: str, tmp_path: Path, answered: list[str], heard: Heard | None = None
) -> AsyncIterator[tuple[Cluster, AsyncExitStack, Client, Client]]:
    """The cluster, and alice's client of each replica (the second's lines and progress to
    ``heard``); more clients may be opened on the stack."""
    async with cluster_of(redis, prefix, tmp_path, answered) as cluster, AsyncExitStack() as stack:
        on_0 = await modern(stack, cluster.endpoint(0), "alice")
        yield cluster, stack, on_0, await modern(stack, cluster.endpoint(1), "alice", heard)


def accepting(value: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"value": value})


async def first_round(client: Client, tool: str = "asker__ask") -> tuple[str, str]:
    """The call's first round (asking for progress: the upstream gets a token only then): the
    request state and the key of its one question."""
    first = await client.session.call_tool(
        tool, {}, progress_callback=Heard().on_progress, allow_input_required=True
    )
    assert isinstance(first, types.InputRequiredResult), first
    assert first.request_state is not None
    [key] = first.input_requests or {}
    return first.request_state, key


def text_of(result: types.CallToolResult | types.InputRequiredResult) -> str:
    assert isinstance(result, types.CallToolResult), result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_a_retry_reaching_the_other_replica_is_served_by_the_one_holding_the_call(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    answered: list[str] = []
    heard = Heard()
    async with alice_on_both(redis, prefix, tmp_path, answered, heard) as (cluster, stack, on_0, on_1):
        state, key = await first_round(on_0)
        with anyio.fail_after(BOUND):
            done = await on_1.session.call_tool(
                "asker__ask",
                {},
                progress_callback=heard.on_progress,
                input_responses={key: accepting("ada")},
                request_state=state,
                meta={types.LOG_LEVEL_META_KEY: "info"},  # pyright: ignore[reportArgumentType]
            )
        assert text_of(done) == "hello ada"
        # Replica 0's upstream session had the question, and the answer given through replica 1.
        assert answered == ["ada"]
        assert heard.progress == [(1.0, 2.0, "named ada")]
        assert heard.logs == [{"msg": "working for ada", "extra": None}]  # FastMCP's shape of a line
        assert "its round sent to replica" in cluster.log(1)

        # Another client's retry of alice's call is refused on the other replica too (by the
        # SDK's seal, which binds the state to alice), and nothing reaches the upstream for it.
        state, key = await first_round(on_0)
        on_1_bob = await modern(stack, cluster.endpoint(1), "bob")
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await on_1_bob.session.call_tool(
                "asker__ask", {}, input_responses={key: accepting("mallory")}, request_state=state
            )
        assert answered == ["ada"]
        assert (
            text_of(
                await on_1.session.call_tool(
                    "asker__ask", {}, input_responses={key: accepting("bea")}, request_state=state
                )
            )
            == "hello bea"
        )
        assert answered == ["ada", "bea"]


async def test_a_round_served_across_replicas_may_end_in_the_calls_next_question(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    # The holder sends a round's outcome back as a message (store/round_messages.Outcome):
    # more questions are an outcome too, and the next round goes across again.
    answered: list[str] = []
    async with alice_on_both(redis, prefix, tmp_path, answered) as (_cluster, _, on_0, on_1):
        state, key = await first_round(on_0, "asker__ask_twice")
        with anyio.fail_after(BOUND):
            second = await on_1.session.call_tool(
                "asker__ask_twice",
                {},
                input_responses={key: accepting("ada")},
                request_state=state,
                allow_input_required=True,
            )
            assert isinstance(second, types.InputRequiredResult), second
            assert second.request_state is not None
            [key] = second.input_requests or {}
            done = await on_1.session.call_tool(
                "asker__ask_twice",
                {},
                input_responses={key: accepting("lovelace")},
                request_state=second.request_state,
            )
        assert text_of(done) == "hello ada lovelace"


async def test_a_round_given_up_on_the_other_replica_cancels_the_call_upstream(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    answered: list[str] = []
    async with alice_on_both(redis, prefix, tmp_path, answered) as (_cluster, _, on_0, on_1):
        state, key = await first_round(on_0, "asker__ask_then_wait")
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: on_1.session.call_tool(
                    "asker__ask_then_wait", {}, input_responses={key: accepting("x")}, request_state=state
                )
            )
            with anyio.fail_after(BOUND):
                while answered != ["waiting"]:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()  # the client closes the round's stream on replica 1
        with anyio.fail_after(BOUND):
            while answered != ["waiting", "cancelled"]:  # replica 0 cancelled the upstream's call
                await anyio.sleep(0.05)


async def test_a_retry_for_a_replica_that_is_gone_is_refused_at_once(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    answered: list[str] = []
    async with alice_on_both(redis, prefix, tmp_path, answered) as (cluster, _, on_0, on_1):
        state, key = await first_round(on_0)
        cluster.kill(0)
        with anyio.fail_after(5):  # not the holder's heartbeat (10 s): nobody heard the round
            late = await on_1.session.call_tool(
                "asker__ask", {}, input_responses={key: accepting("ada")}, request_state=state
            )
        assert late.is_error
        assert "is not held here" in text_of(late)
        assert answered == []


async def test_a_round_served_across_replicas_is_one_trace_from_the_retry_to_the_holder(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    answered: list[str] = []
    async with (
        otlp_receiver() as (endpoint, received),
        cluster_of(redis, prefix, tmp_path, answered, telemetry={"otlp_endpoint": endpoint}) as cluster,
        AsyncExitStack() as stack,
    ):
        on_0 = await modern(stack, cluster.endpoint(0), "alice")
        on_1 = await modern(stack, cluster.endpoint(1), "alice")
        state, key = await first_round(on_0)
        done = await on_1.session.call_tool(
            "asker__ask", {}, input_responses={key: accepting("ada")}, request_state=state
        )
        assert text_of(done) == "hello ada"
        spans = await received.wait_for(
            lambda seen: len([s for s in seen if s.name == "held_call.round asker__ask"]) == 2, timeout=BOUND
        )
    sent = one(spans, "held_call.round asker__ask", "CLIENT")
    served = one(spans, "held_call.round asker__ask", "SERVER")
    [retry] = [s for s in spans if s.span_id == sent.parent_id]  # on replica 1: the retry's own
    assert (retry.name, retry.kind, retry.trace_id) == ("tools/call asker__ask", "SERVER", sent.trace_id)
    assert (served.trace_id, served.parent_id) == (sent.trace_id, sent.span_id)  # on replica 0
    assert (
        served.attributes["agent_gateway.replica.holder"] == sent.attributes["agent_gateway.replica.holder"]
    )


def one(spans: list[SpanSeen], name: str, kind: str) -> SpanSeen:
    [found] = [s for s in spans if s.name == name and s.kind == kind]
    return found


async def test_a_draining_holder_serves_its_held_calls_rounds_until_they_end(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    """SIGTERM closes the holder's listener, but its held call's retry still comes through the
    other replica: the holder waits for it (within its drain time), then exits."""
    answered: list[str] = []
    async with alice_on_both(redis, prefix, tmp_path, answered) as (cluster, _, on_0, on_1):
        state, key = await first_round(on_0)
        cluster.processes[0].send_signal(signal.SIGTERM)
        await until_logged(cluster, 0, "held calls wait for their clients' answers")
        done = await on_1.session.call_tool(
            "asker__ask", {}, input_responses={key: accepting("ada")}, request_state=state
        )
        assert text_of(done) == "hello ada"
        exit_code = await anyio.to_thread.run_sync(cluster.processes[0].wait, BOUND)
    assert answered == ["ada"]
    assert exit_code == 0


async def until_logged(cluster: Cluster, replica: int, *words: str) -> None:
    """Until a line of ``replica``'s log holds all of ``words``."""
    with anyio.fail_after(BOUND):
        while not any(all(w in line for w in words) for line in cluster.log(replica).splitlines()):
            await anyio.sleep(0.05)
