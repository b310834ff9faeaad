"""Upstreams that crash, hang, freeze, dawdle, lie or flood: each call gets a clear answer,
other clients keep being served, and nothing leaks (see ``harness``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Scope, Send

from agent_gateway.compat import mcp as compat_mcp
from agent_gateway.compat.mcp import MAX_MESSAGE_DEPTH, MAX_MESSAGE_VALUES
from agent_gateway.upstreams.translation import MAX_ERROR_DATA, MAX_ERROR_MESSAGE
from tests.faults.harness import (
    Faulted,
    HttpProcess,
    faulty_stdio,
    gateway_under_fault,
    pid_alive,
    text_of,
    wait_until,
)
from tests.support import SERVERS, intercepted, serving


async def call_in_background(
    client: Client, name: str, outcome: dict[str, types.CallToolResult], tg: anyio.abc.TaskGroup
) -> None:
    async def call() -> None:
        outcome[name] = await client.call_tool(name, {})

    tg.start_soon(call)


async def in_flight(faulted: Faulted, upstream: str, count: int = 1) -> None:
    guard = faulted.gw.gateway.pool.get(upstream).guard
    await wait_until(lambda: guard.in_flight >= count)


async def test_an_upstream_killed_mid_call_fails_the_call_at_once_and_is_restarted() -> None:
    async with gateway_under_fault({"faulty": faulty_stdio(timeout=60)}) as faulted:
        upstream = faulted.gw.gateway.pool.get("faulty")
        async with Client(faulted.gw.url) as client:
            first = int(text_of(await client.call_tool("faulty__pid", {})))
            outcome: dict[str, types.CallToolResult] = {}
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                await call_in_background(client, "faulty__hang", outcome, tg)
                await in_flight(faulted, "faulty")
                started = time.monotonic()
                os.kill(first, signal.SIGKILL)
            assert time.monotonic() - started < 5  # not the 60 s timeout
            assert outcome["faulty__hang"].is_error
            assert "upstream 'faulty'" in text_of(outcome["faulty__hang"])
            await wait_until(lambda: upstream.connections == 2 and upstream.state == "up")
            second = int(text_of(await client.call_tool("faulty__pid", {})))
        assert second != first
        assert not pid_alive(first)


async def test_an_http_upstream_killed_mid_call_fails_the_call_and_is_reconnected_when_back() -> None:
    process = HttpProcess()
    async with (
        process.running(),
        gateway_under_fault(
            {"faulty": {"url": process.url, "timeout": 60, "retry": {"max_delay": 1}}}
        ) as faulted,
    ):
        upstream = faulted.gw.gateway.pool.get("faulty")
        async with Client(faulted.gw.url) as client:
            outcome: dict[str, types.CallToolResult] = {}
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                await call_in_background(client, "faulty__hang", outcome, tg)
                await in_flight(faulted, "faulty")
                started = time.monotonic()
                await process.kill()
            assert time.monotonic() - started < 5
            assert outcome["faulty__hang"].is_error
            assert "upstream 'faulty'" in text_of(outcome["faulty__hang"])
            await process.start()
            await wait_until(lambda: upstream.connections == 2 and upstream.state == "up")
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
        await process.kill()  # the restarted one, before the leak check looks for children


async def test_a_call_the_upstream_never_answers_times_out_and_the_upstream_stays_up() -> None:
    config = faulty_stdio(timeout=30, tool_timeouts={"hang": 0.5})
    async with gateway_under_fault({"faulty": config}) as faulted, Client(faulted.gw.url) as client:
        started = time.monotonic()
        hung = await client.call_tool("faulty__hang", {})
        assert hung.is_error
        assert "upstream 'faulty': tool 'hang': no answer within 0.5s" in text_of(hung)
        assert time.monotonic() - started < 10  # the per-tool timeout, not the upstream's 30 s
        assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
        assert faulted.gw.gateway.pool.get("faulty").connections == 1


async def test_a_frozen_upstream_fails_its_pending_calls_on_the_first_missed_ping_and_is_restarted(
    tmp_path: Path,
) -> None:
    # Stopped, it neither sees its stdin close nor acts on SIGTERM: it was SIGKILLed once both
    # of the SDK's 2 s of grace had passed. Continued as it is stopped, it ends as it may.
    thawed = tmp_path / "thawed"
    config = faulty_stdio(
        timeout=60, health={"interval": 0.3, "timeout": 2}, env={"FAULTY_THAWED": str(thawed)}
    )
    async with gateway_under_fault({"faulty": config}) as faulted, Client(faulted.gw.url) as client:
        upstream = faulted.gw.gateway.pool.get("faulty")
        first = int(text_of(await client.call_tool("faulty__pid", {})))
        outcome: dict[str, types.CallToolResult] = {}
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            await call_in_background(client, "faulty__hang", outcome, tg)
            await in_flight(faulted, "faulty")
            outcome["faulty__freeze"] = await client.call_tool("faulty__freeze", {})
        assert time.monotonic() - started < 15  # well before the 60 s call timeout
        for result in outcome.values():
            assert result.is_error
            assert "health check: no answer within 2s" in text_of(result)
        await wait_until(lambda: upstream.connections == 2 and upstream.state == "up")
        assert int(text_of(await client.call_tool("faulty__pid", {}))) != first
        await wait_until(lambda: not pid_alive(first))
        assert thawed.read_text() == "thawed"


async def test_a_slow_call_does_not_hold_up_other_calls_to_the_same_upstream() -> None:
    async with gateway_under_fault({"faulty": faulty_stdio(timeout=30)}) as faulted:
        outcome: dict[str, types.CallToolResult] = {}
        async with Client(faulted.gw.url) as client, anyio.create_task_group() as tg:

            async def slow() -> None:
                outcome["slow"] = await client.call_tool("faulty__slow", {"seconds": 2})

            tg.start_soon(slow)
            await in_flight(faulted, "faulty")
            for _ in range(5):
                assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
            assert "slow" not in outcome  # the pings were all answered while it was pending
        assert text_of(outcome["slow"]) == "slept 2s"


async def test_lines_that_are_not_json_rpc_and_stray_responses_are_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with gateway_under_fault({"faulty": faulty_stdio()}) as faulted, Client(faulted.gw.url) as client:
        upstream = faulted.gw.gateway.pool.get("faulty")
        assert text_of(await client.call_tool("faulty__garbage", {})) == "wrote garbage"
        answered = int(text_of(await client.call_tool("faulty__request_id", {})))
        outcome: dict[str, types.CallToolResult] = {}
        async with anyio.create_task_group() as tg:
            await call_in_background(client, "faulty__hang", outcome, tg)
            await in_flight(faulted, "faulty")
            # Answers to ids never sent: unknown ones, a string for an integer id (this call's
            # own and the hanging call's), and a second answer to a call already answered.
            stray = await client.call_tool("faulty__stray", {"answered": answered})
            assert text_of(stray) == "wrote stray responses"
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
            assert outcome == {}  # the hanging call was not answered by a stray
            assert upstream.guard.in_flight == 1
            tg.cancel_scope.cancel()
        assert (upstream.connections, upstream.state) == (1, "up")
    logged = caplog.text
    assert logged.count("wrote a line that is not JSON-RPC") == 2
    assert logged.count("a response to an id never sent on this session") == 6


async def test_an_answer_that_is_not_utf8_fails_its_call_at_once() -> None:
    # Handed to the session as a bare error, it was logged and read past: the call waited out
    # its whole timeout (the upstream's real answer comes a minute later here).
    async with gateway_under_fault({"faulty": faulty_stdio()}) as faulted, Client(faulted.gw.url) as client:
        with anyio.fail_after(20):
            mangled = await client.call_tool("faulty__mangled", {})
        assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
        upstream = faulted.gw.gateway.pool.get("faulty")
        assert (upstream.connections, upstream.state) == (1, "up")
    assert mangled.is_error
    assert "the upstream's message is not valid UTF-8" in text_of(mangled)


async def test_a_50_mb_result_arrives_whole_and_the_gateway_keeps_serving() -> None:
    config = faulty_stdio(timeout=120)
    async with gateway_under_fault({"faulty": config}) as faulted, Client(faulted.gw.url) as client:
        result = await client.call_tool("faulty__big", {"megabytes": 50})
        assert not result.is_error
        assert len(text_of(result)) == 50 * 1024 * 1024
        assert text_of(await client.call_tool("faulty__ping", {})) == "pong"


FLAP_RESTARTS = int(os.environ.get("AGENT_GATEWAY_FLAP_RESTARTS", "3"))
"""How often the upstream is killed and started again under load (raise it for a soak)."""
FLAP_ANSWERS = 8
"""Answers of each kind the callers get in each phase of a flap."""


async def test_an_upstream_flapping_under_load_gets_every_call_answered() -> None:
    process = HttpProcess()
    config = {
        "url": process.url,
        "timeout": 5,
        "retry": {"initial_delay": 0.1, "max_delay": 0.5},
        "health": {"interval": 0.5, "timeout": 1},
    }
    answered: dict[str, int] = {"ok": 0, "upstream error": 0}
    restarts = 0
    async with process.running(), gateway_under_fault({"faulty": config}) as faulted:

        async def caller() -> None:
            async with Client(faulted.gw.url) as client:
                while True:
                    with anyio.fail_after(15):  # every call is answered: never a hang
                        result = await client.call_tool("faulty__ping", {})
                    if not result.is_error:
                        answered["ok"] += 1
                    else:
                        assert "upstream 'faulty'" in text_of(result), text_of(result)
                        answered["upstream error"] += 1
                    await anyio.sleep(0.01)

        async def more(kind: str) -> None:
            """Until the callers have had a few more answers of ``kind`` (the load each phase
            is under: waited for, not slept through)."""
            before = answered[kind]
            await wait_until(lambda: answered[kind] >= before + FLAP_ANSWERS)

        async def flap() -> None:
            nonlocal restarts
            while restarts < FLAP_RESTARTS:
                await more("ok")  # up again: reconnected, and serving the callers
                await process.kill()
                await more("upstream error")  # down: the callers are told so, none hangs
                await process.start()
                restarts += 1

        upstream = faulted.gw.gateway.pool.get("faulty")
        with anyio.fail_after(FLAP_RESTARTS * 30):  # a start took 16 s on a loaded machine
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(caller)
                await flap()
                tg.cancel_scope.cancel()
        await wait_until(lambda: upstream.state == "up")
        async with Client(faulted.gw.url) as client:
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
        await process.kill()
    assert answered["ok"] > 0
    assert answered["upstream error"] > 0
    # It came back again and again: after most restarts (a restart can come before the gateway
    # noticed the last kill).
    assert upstream.connections >= restarts / 2


async def test_a_result_over_max_message_bytes_fails_its_call_clearly_and_the_rest_goes_on() -> None:
    config = faulty_stdio(max_message_bytes=2**20)
    async with gateway_under_fault({"faulty": config}) as faulted, Client(faulted.gw.url) as client:
        result = await client.call_tool("faulty__big", {"megabytes": 3})
        assert result.is_error
        assert "over max_message_bytes (1048576)" in text_of(result)
        assert text_of(await client.call_tool("faulty__ping", {})) == "pong"
        upstream = faulted.gw.gateway.pool.get("faulty")
        assert (upstream.connections, upstream.state) == (1, "up")  # read past, not reconnected


@pytest.mark.parametrize("levels", [300, 1200])
async def test_a_result_nested_deeper_than_the_gateway_reads_fails_its_call_alone(levels: int) -> None:
    # msgspec raises RecursionError past ~1,000 levels: over stdio it ended the reader, so
    # every call in flight on the shared session failed and the upstream was restarted. Past
    # ~255 the SDK failed to write the answer: -32603 and an ERROR traceback for each call.
    hostile = {"command": sys.executable, "args": [str(SERVERS / "hostile_listings.py"), "good"]}
    async with gateway_under_fault({"deep": hostile}) as faulted, Client(faulted.gw.url) as client:
        kept = await client.call_tool("deep__nested", {"levels": MAX_MESSAGE_DEPTH - 5})
        refused = await client.call_tool("deep__nested", {"levels": levels})
        served = await client.call_tool("deep__collide", {})
        upstream = faulted.gw.gateway.pool.get("deep")
        assert (upstream.connections, upstream.state) == (1, "up")
    assert text_of(kept) == "deep"
    assert refused.is_error
    assert f"nests deeper than the gateway reads ({MAX_MESSAGE_DEPTH} levels)" in text_of(refused)
    assert text_of(served) == "collide"


async def test_a_result_of_more_json_values_than_the_gateway_reads_fails_its_call_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Parsed, 128 MiB of JSON values (the default max_message_bytes) is tens of millions of
    # objects: seconds of the event loop and gigabytes for every client, not this call's.
    # Over each transport in turn, on one gateway (each was a case of its own, a gateway each);
    # one upstream process serves both HTTP eras. The bound is what is tested, not its size: a
    # tenth of it here (a million values made and counted three times took 8 s of the test).
    monkeypatch.setattr(compat_mcp, "MAX_MESSAGE_VALUES", MAX_MESSAGE_VALUES // 10)
    most = compat_mcp.MAX_MESSAGE_VALUES
    process = HttpProcess()
    upstreams = {
        "stdio": faulty_stdio(),
        "modern": {"url": process.url},
        "handshake": {"url": process.url, "protocol": "legacy"},
    }
    async with (
        process.running(),
        gateway_under_fault(upstreams) as faulted,
        Client(faulted.gw.url) as client,
    ):
        for name in upstreams:
            refused = await client.call_tool(f"{name}__numbers", {"count": most + 1})
            served = await client.call_tool(f"{name}__numbers", {"count": 3})
            upstream = faulted.gw.gateway.pool.get(name)
            assert (upstream.connections, upstream.state) == (1, "up"), name
            assert refused.is_error, name
            assert f"the gateway reads at most {most:,} from one message" in text_of(refused), name
            assert served.structured_content == {"result": [0, 0, 0]}, name


NAN_RESULT = {"content": [{"type": "text", "text": "read"}], "structuredContent": {"v": float("nan")}}
REFUSAL = {"code": -32000, "message": "bad input"}
LOUD_NAN_LINE = {
    "jsonrpc": "2.0",
    "method": "notifications/message",
    "params": {"level": "info", "data": float("nan")},
}
CHATTY_RESULT = {"content": [{"type": "text", "text": "said"}]}


def _events(*messages: dict[str, Any]) -> bytes:
    """``messages`` as one SSE stream, each written by Python's ``json.dumps`` (NaN and all)."""
    return b"".join(b"event: message\ndata: " + json.dumps(m).encode() + b"\n\n" for m in messages)


def odd_http_upstream() -> ASGIApp:
    """FastMCP over Streamable HTTP, but its tool ``reading`` answered raw with ``NaN`` in its
    structured content, as Python's ``json.dumps`` writes a float NaN (an SDK server writes
    null), ``refuse`` with ``-32000 bad input``, and ``chatty`` with a stream whose log line
    holds NaN before its result; ``collide`` is FastMCP's."""
    server = FastMCP("odd")
    server.tool(lambda: "collide", name="collide")
    for name in ("reading", "refuse", "chatty"):
        server.tool(lambda: "never sent", name=name)

    async def intercept(scope: Scope, message: dict[str, object], send: Send) -> bool:
        params = message.get("params")
        name = (
            params.get("name") if message.get("method") == "tools/call" and isinstance(params, dict) else None
        )
        if name not in ("reading", "refuse", "chatty"):
            return False
        answer = {"result": NAN_RESULT} if name == "reading" else {"error": REFUSAL}
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], **answer}).encode()
        if name == "chatty":
            body = _events(LOUD_NAN_LINE, {"jsonrpc": "2.0", "id": message["id"], "result": CHATTY_RESULT})

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        kind = "text/event-stream" if name == "chatty" else "application/json"
        await Response(body, media_type=kind)(scope, nothing, send)
        return True

    return intercepted(server, intercept)


TRANSPORTS = ("stdio", "modern", "handshake")


@asynccontextmanager
async def odd_upstream(transport: str) -> AsyncIterator[dict[str, Any]]:
    """The config of an upstream answering ``reading`` and ``refuse`` oddly, over ``transport``."""
    if transport == "stdio":
        yield {"command": sys.executable, "args": [str(SERVERS / "hostile_listings.py"), "good"]}
        return
    async with serving(odd_http_upstream()) as base:
        yield {"url": f"{base}/mcp"} | ({"protocol": "legacy"} if transport == "handshake" else {})


@asynccontextmanager
async def odd_gateway(*transports: str) -> AsyncIterator[tuple[Faulted, Client]]:
    """A gateway under fault over ``odd_upstream(t)`` for each of ``transports``, each upstream
    named after its transport, and a client of it. One gateway for every transport a test
    tries (a gateway each was most of these tests' time)."""
    async with contextlib.AsyncExitStack() as stack:
        upstreams = {t: await stack.enter_async_context(odd_upstream(t)) for t in transports}
        faulted = await stack.enter_async_context(gateway_under_fault(upstreams))
        yield faulted, await stack.enter_async_context(Client(faulted.gw.url))


async def test_an_answer_holding_nan_fails_its_call_and_never_reaches_the_client_as_null() -> None:
    # msgspec refuses NaN; the SDK's parser (pydantic's) took it, and wrote it to the client as
    # null: a value the upstream never sent. Over the modern era's forwarding, a parse error.
    async with odd_gateway(*TRANSPORTS) as (_, client):
        for name in TRANSPORTS:
            refused = await client.call_tool(f"{name}__reading", {})
            served = await client.call_tool(f"{name}__collide", {})
            assert refused.is_error, name
            assert refused.structured_content is None, name
            assert (
                "holds NaN, Infinity or a number past a double's range, which JSON does not have"
                in text_of(refused)
            ), name
            assert text_of(served) == "collide", name


async def test_an_unreadable_log_line_on_a_calls_stream_is_dropped_and_the_call_answered() -> None:
    # As over stdio, where such a line is dropped: before, over the modern era's forwarding,
    # the line failed the call it came with.
    async with odd_gateway("modern", "handshake") as (_, client):
        for name in ("modern", "handshake"):
            answered = await client.call_tool(f"{name}__chatty", {})
            assert not answered.is_error, (name, text_of(answered))
            assert text_of(answered) == "said", name


async def test_an_upstreams_own_minus_32000_error_reaches_its_caller_and_its_session_goes_on() -> None:
    # -32000 is also the code the SDK gives a closed connection: read as one, a tool's "bad
    # input" (which any client can ask for) ended a stdio session, failing every client's
    # calls on it and restarting the process; over HTTP it became "its answer ended early".
    async with odd_gateway(*TRANSPORTS) as (faulted, client):
        for name in TRANSPORTS:
            refused = await client.call_tool(f"{name}__refuse", {})
            served = await client.call_tool(f"{name}__collide", {})
            upstream = faulted.gw.gateway.pool.get(name)
            assert (upstream.connections, upstream.state) == (1, "up"), name
            assert refused.is_error, name
            assert text_of(refused) == f"upstream '{name}': tool 'refuse': bad input"
            assert text_of(served) == "collide", name


async def test_an_upstreams_megabytes_of_error_reach_its_caller_cut_and_scrubbed() -> None:
    # Passed whole, 30 MB of an error's message took the event loop 3 s to scrub of its
    # upstream's credential (a step per character), and reached the client and the log whole.
    key = "sk-live-0123456789abcdef"
    loud = {
        "command": sys.executable,
        "args": [str(SERVERS / "hostile_listings.py"), "good"],
        "env": {"LOUD_KEY": key},
    }
    async with gateway_under_fault({"loud": loud}) as faulted, Client(faulted.gw.url) as client:
        cut = await client.call_tool("loud__loud", {"chars": 8_000_000, "data": 10})
        left_out = await client.call_tool("loud__loud", {"chars": 100, "data": 100_000})
        served = await client.call_tool("loud__collide", {})
    said = text_of(cut)
    assert said.startswith("upstream 'loud': tool 'loud': refused with key [redacted]: xxx")
    assert said.endswith("… (8000000 characters)")
    assert len(said) < MAX_ERROR_MESSAGE + 100
    assert key not in said
    assert text_of(left_out).endswith(f"(its data, over {MAX_ERROR_DATA} characters, left out)")
    assert text_of(served) == "collide"


async def test_an_upstreams_own_timeout_answers_are_answers_not_the_gateways_timeouts() -> None:
    # Read as the gateway's own timeout, each -32001 answer counted against the upstream's
    # breaker (health checks off): a client calling such a tool opened the circuit for all.
    odd = {"command": sys.executable, "args": [str(SERVERS / "hostile_listings.py"), "good"]}
    unchecked = odd | {"health": {"interval": None}}
    async with gateway_under_fault({"odd": unchecked}) as faulted, Client(faulted.gw.url) as client:
        refused = [await client.call_tool("odd__refuse", {"code": -32001}) for _ in range(10)]
        served = await client.call_tool("odd__collide", {})
        circuit = faulted.gw.gateway.pool.get("odd").guard.breaker
    assert all(r.is_error and text_of(r) == "upstream 'odd': tool 'refuse': bad input" for r in refused)
    assert text_of(served) == "collide"
    assert circuit is not None
    assert str(circuit.state) == "closed"
