"""Issue 16, finding 14: exact Host and Origin checks, hidden names answered as unknown ones,
/status for admin clients only, a minimal public health, one upstream's name clash contained,
private conversation files, and a bounded exit when the collector is unreachable."""

from __future__ import annotations

import json
import logging
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
import yaml
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent_gateway.catalog import Catalog
from agent_gateway.catalog_parts import Listing
from agent_gateway.config_files import parse_config
from agent_gateway.host_check import HostNames
from tests.agent.scripted import ScriptedChatModel, answer
from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, INITIALIZE, client
from tests.support import (
    RunningGateway,
    free_port,
    gateway_env,
    ready,
    running_gateway,
    serving_upstream,
)


def _library() -> FastMCP:
    server = FastMCP("library")

    @server.tool
    def echo(text: str) -> str:
        return text

    @server.resource("book://public")
    def public() -> str:
        return "open"

    @server.resource("book://secret")
    def secret() -> str:
        return "closed"

    @server.prompt
    def summary(topic: str) -> str:
        return f"Summarise {topic}."

    return server


@asynccontextmanager
async def library(**extra: Any) -> AsyncIterator[RunningGateway]:
    async with serving_upstream(_library()) as url:
        config = {
            "upstreams": {"library": {"url": url}},
            "auth": {
                "mode": "bearer",
                "tokens": [
                    {"name": "operator", "token": "${B}", "policy": "operators"},
                    {"name": "reader", "token": "${A}", "policy": "readers"},
                ],
                "policies": {
                    "operators": {"admin": True},
                    "readers": {"tools": ["library__*"], "prompts": [], "resources": ["book://public"]},
                },
            },
        } | extra
        async with running_gateway(config, environ={"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}) as gw:
            yield gw


async def test_host_and_origin_are_compared_exactly() -> None:
    async with library() as gw, httpx.AsyncClient() as http:
        port = httpx.URL(gw.base).port
        health = f"{gw.base}/healthz"
        for host in (f"127.0.0.1:{port}.evil.com", f"127.0.0.1:{port}@evil.com", "127.0.0.1:1", "a b"):
            assert (await http.get(health, headers={"Host": host})).status_code == 421, host
        assert (await http.get(health, headers={"Host": f"localhost:{port}"})).status_code == 200
        # A page on another local port is another origin; the gateway's own is not.
        other = {"Origin": "http://localhost:3000"}
        assert (await http.get(health, headers=other)).status_code == 403
        own = {"Origin": f"http://127.0.0.1:{port}"}
        assert (await http.get(health, headers=own)).status_code == 200


async def _head_of(port: int, request: str) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request.encode())
        answer = b""
        with anyio.fail_after(10):
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive()
    return answer


async def test_an_absolute_form_target_is_checked_as_the_host_it_names_not_the_host_header() -> None:
    # Before, the Host header alone was checked: a request for http://evil.example/mcp with a
    # loopback Host opened a session (RFC 9112 3.2.2: the target's host is the one that counts).
    async with library() as gw, client(gw.url, BYSTANDER_TOKEN) as bystander:
        port = httpx.URL(gw.base).port
        assert port is not None
        body = json.dumps(INITIALIZE)

        def post(target: str, host: str) -> str:
            return (
                f"POST {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ATTACKER_TOKEN}\r\n"
                "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            )

        loopback = f"127.0.0.1:{port}"
        for target in (
            "http://evil.example/mcp",
            f"http://evil.example:{port}/mcp",
            "https://x@127.0.0.1/mcp",
        ):
            answer = await _head_of(port, post(target, loopback))
            assert answer.startswith(b"HTTP/1.1 421 "), (target, answer[:100])
        # The target's loopback name passes, whatever the Host header says.
        answer = await _head_of(port, post(f"http://{loopback}/mcp", "evil.example"))
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
        # Two Host lines are refused whatever the target (RFC 9112 3.2): the target's
        # authority replaced them both, so they passed as one.
        answer = await _head_of(port, post(f"http://{loopback}/mcp", f"{loopback}\r\nHost: {loopback}"))
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]
        served = await bystander.call_tool("library__echo", {"text": "y"})
    assert not served.is_error


async def test_only_loopback_names_the_bound_address_and_allowed_hosts_pass_as_host() -> None:
    server = {
        "allowed_hosts": ["gateway.test", "*.corp.test:8000"],
        "allowed_origins": ["https://*.ide.test"],
    }
    async with library(server=server) as gw:
        health = f"{gw.base}/healthz"
        async with httpx.AsyncClient() as http:
            for host in ("gateway.test", "gateway.test:9999", "a.corp.test", "B.Corp.Test:1"):
                assert (await http.get(health, headers={"Host": host})).status_code == 200, host
            for host in ("corp.test", "evil.test", "gateway.test.evil.test", "10.0.0.1"):
                assert (await http.get(health, headers={"Host": host})).status_code == 421, host
            # An Origin glob over the host does not run over a port (both compared with it written out).
            for origin, status in (("https://a.ide.test", 200), ("https://a.ide.test:443", 200)):
                assert (await http.get(health, headers={"Origin": origin})).status_code == status, origin
            assert (await http.get(health, headers={"Origin": "https://a.ide.test:8443"})).status_code == 403
        # Two Host headers: which one counts would depend on the layer that reads it.
        port = httpx.URL(gw.base).port
        assert port is not None
        twice = f"GET /healthz HTTP/1.1\r\nHost: evil.test\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(twice.encode())
            assert (await stream.receive()).startswith(b"HTTP/1.1 400 ")
    assert HostNames([], "10.1.2.3").holds("10.1.2.3")
    assert not HostNames([], "0.0.0.0").holds("0.0.0.0")  # unspecified: not a name
    assert not HostNames([], "::").holds("::")
    assert HostNames(["*"], None).holds("anything.test")


async def test_hidden_resources_and_prompts_are_answered_as_unknown_ones() -> None:
    async with library() as gw, client(gw.url, ATTACKER_TOKEN) as reader:
        answers: list[str] = []
        for uri in ("book://secret", "book://nothing-here"):
            with pytest.raises(MCPError) as caught:
                await reader.read_resource(uri)
            answers.append(caught.value.error.message.replace(uri, "URI"))
        assert answers[0] == answers[1]
        completions: list[str] = []
        for name in ("library__summary", "library__nothing"):
            with pytest.raises(MCPError) as caught:
                await reader.complete(
                    types.PromptReference(type="ref/prompt", name=name), {"name": "topic", "value": "a"}
                )
            completions.append(caught.value.error.message.replace(name, "NAME"))
        assert completions[0] == completions[1]


@pytest.mark.parametrize("server", [{}, {"public_health": "minimal"}], ids=["by-default", "minimal"])
async def test_status_is_for_admin_clients_and_readyz_says_only_ready_with_auth_on(
    server: dict[str, str],
) -> None:
    # Open to whoever reaches the port, a full /readyz told upstream hosts and their errors.
    async with library(server=server) as gw, httpx.AsyncClient() as http:

        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        assert (await http.get(f"{gw.base}/status")).status_code == 401
        assert (await http.get(f"{gw.base}/status", headers=bearer(ATTACKER_TOKEN))).status_code == 403
        assert (await http.get(f"{gw.base}/status", headers=bearer(BYSTANDER_TOKEN))).status_code == 200
        ready = await http.get(f"{gw.base}/readyz")
        assert ready.json() == {"ready": True}
    async with library(server={"public_health": "full"}) as gw, httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.base}/readyz")).json()["upstreams"][0]["name"] == "library"


async def test_one_upstream_giving_two_tools_one_public_name_serves_the_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FastMCP("clash")
    server.tool(lambda: "dotted", name="a.b")
    server.tool(lambda: "underscored", name="a_b")
    async with serving_upstream(server) as url, serving_upstream(_library()) as other:
        config = {"upstreams": {"clash": {"url": url}, "library": {"url": other}}}
        async with running_gateway(config) as gw, Client(gw.url) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert {"clash__a_b", "library__echo"} <= names
    [warning] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert (
        "1 tools skipped: their public names are already given ('a_b': 'clash__a_b' is already 'a.b''s)"
        in warning
    )
    assert "prefix" not in warning


async def test_an_upstream_listing_one_name_thousands_of_times_is_told_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The upstream chooses how many names it repeats, and how often it lists them: one line a
    # listing (and the log's repeat filter, one a window), not one per repeated name.
    config = parse_config({"upstreams": {"dups": {"url": "http://127.0.0.1:9/mcp"}}}, {}, source="test")
    tools = tuple(types.Tool(name="same", input_schema={"type": "object"}) for _ in range(2000))
    catalog = Catalog(config)
    with caplog.at_level(logging.WARNING, logger="agent_gateway.catalog"):
        await catalog.update("dups", Listing(tools=tools))
    assert list(catalog.start().tools) == ["dups__same"]
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("upstream dups: 1999 tools skipped")


async def test_the_conversations_file_and_its_directory_are_private(tmp_path: Path) -> None:
    model = ScriptedChatModel(respond=lambda messages: answer("ok"))
    memory = tmp_path / "state" / "conversations.sqlite"
    async with serving_upstream(_library()) as url:
        config = {"upstreams": {"library": {"url": url}}, "agent": {"memory": {"path": str(memory)}}}
        async with running_gateway(config, chat_model=model) as gw, Client(gw.url) as c:
            await c.call_tool("ask_agent", {"query": "hi"})
    assert stat.S_IMODE(memory.stat().st_mode) == 0o600
    assert stat.S_IMODE(memory.parent.stat().st_mode) == 0o700


async def test_sigterm_exits_promptly_when_the_collector_is_unreachable(tmp_path: Path) -> None:
    gateway_port, collector = free_port(), free_port()  # nothing listens on the collector's:
    # every export fails
    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"port": gateway_port},
                "upstreams": {
                    "notes": {"command": sys.executable, "args": ["-m", "agent_gateway.demo_server"]}
                },
                "telemetry": {"otlp_endpoint": f"http://127.0.0.1:{collector}"},
            }
        )
    )
    gateway = subprocess.Popen(
        [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(path)], env=gateway_env()
    )
    try:
        await ready(gateway_port)
        async with Client(f"http://127.0.0.1:{gateway_port}/mcp") as c:
            await c.call_tool("notes__add", {"text": "a span to export"})
        gateway.send_signal(signal.SIGTERM)
        # Before the bound, the exporters' retries held the exit for ~24 s. (Today's SDK ends an
        # export to a refused port within its timeout, so the bound itself is tested with a
        # collector that never answers: tests/test_telemetry_settings.py.)
        assert gateway.wait(timeout=15) == 0
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait(timeout=10)
