"""Upstream words only for clients that may reach the upstream (issue 16, finding 9): its
``instructions`` in ``initialize``, its log lines outside any call, and its name in
``ask_agent``'s description."""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import httpx2
import mcp_types as types
import yaml
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agent_gateway.upstreams.connection import UpstreamState
from tests.faults.harness import text_of, wait_until
from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, bearer
from tests.support import (
    RunningGateway,
    child_process,
    free_port,
    gateway_env,
    python_upstream,
    ready,
    running_gateway,
    serving_upstream,
)


def _server(name: str) -> FastMCP:
    server = FastMCP(name, instructions=f"{name} secret instructions")

    @server.tool
    async def shout(ctx: Context) -> str:
        return "ok"

    return server


@asynccontextmanager
async def two_upstreams() -> AsyncIterator[RunningGateway]:
    async with serving_upstream(_server("public")) as public, serving_upstream(_server("hidden")) as hidden:
        config = {"upstreams": {"public": {"url": public}, "hidden": {"url": hidden}}} | bearer(
            {"tools": ["public__*", "ask_agent"]}
        )
        environ = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
        async with running_gateway(config, environ=environ) as gw:
            yield gw


@asynccontextmanager
async def client(url: str, token: str, logs: list[str], mode: str = "legacy") -> AsyncIterator[Client]:
    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(f"{params.logger}: {params.data}")

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, logging_callback=on_log) as c,  # type: ignore[arg-type]
    ):
        yield c


async def test_a_restricted_modern_client_discovers_only_the_instructions_of_upstreams_it_reaches() -> None:
    async with (
        two_upstreams() as gw,
        client(gw.url, ATTACKER_TOKEN, [], mode="auto") as restricted,  # server/discover, not initialize
        client(gw.url, BYSTANDER_TOKEN, [], mode="auto") as full,
    ):
        seen, everything = restricted.instructions or "", full.instructions or ""
    assert "public secret instructions" in seen
    assert "hidden" not in seen
    assert "hidden secret instructions" in everything


async def test_a_restricted_client_reads_only_the_words_of_upstreams_it_reaches() -> None:
    async with two_upstreams() as gw:
        restricted_logs: list[str] = []
        full_logs: list[str] = []
        async with (
            client(gw.url, ATTACKER_TOKEN, restricted_logs) as restricted,
            client(gw.url, BYSTANDER_TOKEN, full_logs) as full,
        ):
            assert restricted.instructions is not None
            assert "public secret instructions" in restricted.instructions
            assert "hidden" not in restricted.instructions
            assert "hidden secret instructions" in (full.instructions or "")
            tools = {t.name: t for t in (await restricted.list_tools()).tools}
            assert "public" in (tools["ask_agent"].description or "")
            assert "hidden" not in (tools["ask_agent"].description or "")
            everything = {t.name: t for t in (await full.list_tools()).tools}
            assert "hidden" in (everything["ask_agent"].description or "")
            # A log line each upstream sends outside any call.
            params = types.LoggingMessageNotificationParams(level="warning", data="line")
            for upstream in ("public", "hidden"):
                await gw.gateway.broadcast.send(upstream, params)
            # Then a last one it may read: its stream is ordered, so a hidden line sent to it
            # would have arrived before this one.
            end = types.LoggingMessageNotificationParams(level="warning", data="end")
            await gw.gateway.broadcast.send("public", end)
            with anyio.fail_after(10):
                while len(full_logs) < 3 or "public: end" not in restricted_logs:
                    await anyio.sleep(0.02)
    assert full_logs == ["public: line", "hidden: line", "public: end"]
    assert restricted_logs == ["public: line", "public: end"]


async def test_metrics_say_nothing_of_a_hidden_tool_a_client_calls(tmp_path: Path) -> None:
    # Refused alike, a hidden tool and a made-up one were told apart by /metrics (open to
    # scrapers): the hidden one's series carried its name and upstream.
    port = free_port()
    config = {
        "server": {"port": port, "public_health": "full"},  # /metrics open to scrapers
        "upstreams": {"counter": python_upstream("counter.py")},
    } | bearer({"tools": ["counter__increment"]})
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    gateway = [
        str(Path(sys.executable).parent / "agent-gateway"),
        "serve",
        "-c",
        str(tmp_path / "gateway.yaml"),
    ]
    env = {**gateway_env(), "B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
    async with child_process(gateway, env, tmp_path / "gateway.log"):
        await ready(port)
        url = f"http://127.0.0.1:{port}/mcp"
        async with client(url, ATTACKER_TOKEN, []) as attacker:
            refusals = []
            for name in ("counter__pid", "counter__no_such_tool"):
                refused = await attacker.call_tool(name, {})
                assert refused.is_error
                block = refused.content[0]
                assert isinstance(block, types.TextContent)
                refusals.append(block.text.replace(name, "NAME"))
            assert (await attacker.call_tool("counter__increment", {})).structured_content == {"result": 1}
        async with httpx.AsyncClient() as http:
            scraped = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    assert refusals[0] == refusals[1]  # the answers read alike
    assert 'gen_ai_tool_name="counter__increment"' in scraped  # the allowed call is counted by name
    assert "counter__pid" not in scraped
    calls = re.findall(r"^mcp_server_operation_duration_seconds_count\{(.*)\} (\S+)$", scraped, re.M)
    refused_calls = [(labels, count) for labels, count in calls if 'error_type="tool_error"' in labels]
    assert len(refused_calls) == 1, refused_calls  # one series for both: no name, no upstream
    labels, count = refused_calls[0]
    assert 'agent_gateway_upstream=""' in labels
    assert 'gen_ai_tool_name=""' in labels
    assert float(count) == 2


async def test_an_open_circuit_tells_other_clients_nothing_of_the_calls_that_opened_it() -> None:
    # The breaker is shared by every client of an upstream: its refusals, and /readyz, named
    # the last failed request (a tool outside the refused client's policy, or the session id
    # of another client's dedicated session).
    upstream = python_upstream(
        "faulty.py", breaker={"failures": 2, "reset": 60}, retry={"initial_delay": 0.05}
    )
    config = {"upstreams": {"faulty": upstream}, "server": {"public_health": "full"}}
    config |= bearer({"tools": ["faulty__ping"]})
    async with running_gateway(config, environ={"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}) as gw:
        faulty = gw.gateway.pool.get("faulty")
        async with client(gw.url, BYSTANDER_TOKEN, []) as bystander:
            for connection in (1, 2):
                await wait_until(
                    lambda n=connection: faulty.connections == n and faulty.state is UpstreamState.UP
                )
                crashed = await bystander.call_tool("faulty__crash", {})
                assert "connection closed during the call" in text_of(crashed)
        await wait_until(lambda: faulty.connections == 3 and faulty.state is UpstreamState.UP)
        async with client(gw.url, ATTACKER_TOKEN, []) as attacker:
            refused = text_of(await attacker.call_tool("faulty__ping", {}))
        async with httpx.AsyncClient() as http:
            readyz = (await http.get(f"{gw.base}/readyz")).text
    assert "circuit open after 2 failed calls (last: connection closed during the call" in refused
    assert "crash" not in refused
    assert "connection closed during the call" in readyz
    assert "crash" not in readyz
