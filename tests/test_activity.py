"""Every finished client call seen once: its access line, its record, its subscribers; agent runs."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_gateway.activity import Call, cut
from agent_gateway.logs import CLIP, JsonFormatter, TraceIds
from tests.agent.scripted import ScriptedChatModel, call, calls
from tests.support import python_upstream, running_gateway, serving_upstream

MODES = ["legacy", "auto"]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "agent_gateway.calls"]


def echo_server() -> FastMCP:
    server = FastMCP("alpha")

    @server.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @server.prompt
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello, {name}!"

    return server


@pytest.mark.parametrize("mode", MODES)
async def test_each_call_is_one_info_access_line_naming_client_tool_upstream_outcome_and_trace(
    caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    caplog.set_level(logging.INFO, logger="agent_gateway.calls")
    async with (
        serving_upstream(echo_server()) as url,
        running_gateway({"upstreams": {"alpha": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        await client.list_tools()  # not a call: no line
        await client.session.call_tool("alpha__echo", {"text": "hi"}, meta={"traceparent": TRACEPARENT})
        await client.get_prompt("alpha__greet", {"name": "Ada"})
        failed = await client.call_tool("alpha__echo", {"text": 42})
    assert failed.is_error
    lines = access_lines(caplog)
    assert [(r.levelno, r.getMessage().split(" by ")[0]) for r in lines] == [
        (logging.INFO, "tools/call alpha__echo"),
        (logging.INFO, "prompts/get alpha__greet"),
        (logging.INFO, "tools/call alpha__echo"),
    ]
    first: dict[str, Any] = lines[0].fields  # type: ignore[attr-defined]
    assert first | {"at": 0, "duration_ms": 0, "session": None} == {
        "event": "call",
        "at": 0,
        "client": "anonymous",
        "software": "mcp",
        "session": None,
        "method": "tools/call",
        "name": "alpha__echo",
        "upstream": "alpha",
        "outcome": "ok",
        "detail": None,
        "duration_ms": 0,
        "trace_id": TRACE_ID,
        "arguments_digest": hashlib.sha256(b'{"text":"hi"}').hexdigest(),
        "run": None,  # the client's own call, not an agent run's
    }
    assert first["duration_ms"] > 0
    assert (first["session"] is None) == (mode == "auto")  # a modern request is no session
    assert f"-> alpha: ok in {first['duration_ms']:.1f} ms trace {TRACE_ID}" in lines[0].getMessage()
    third: dict[str, Any] = lines[2].fields  # type: ignore[attr-defined]
    assert third["outcome"] == "tool_error"
    assert "Invalid arguments for tool 'alpha__echo'" in third["detail"]


async def test_the_json_log_format_makes_the_access_line_structured(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_gateway.calls")
    async with (
        serving_upstream(echo_server()) as url,
        running_gateway({"upstreams": {"alpha": {"url": url}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        await client.call_tool("alpha__echo", {"text": "hi"})
    [record] = access_lines(caplog)
    TraceIds().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "INFO"
    assert line["logger"] == "agent_gateway.calls"
    assert (line["name"], line["upstream"], line["outcome"], line["client"]) == (
        "alpha__echo",
        "alpha",
        "ok",
        "anonymous",
    )
    assert isinstance(line["duration_ms"], float)


def test_the_json_log_format_cuts_each_structured_field() -> None:
    """A client chooses many fields (names, ids): written as JSON, each is cut to ``CLIP``."""
    record = logging.LogRecord("agent_gateway.calls", logging.INFO, __file__, 1, "%s", ("line",), None)
    record.fields = {"name": "x" * 100_000, "duration_ms": 1.5}
    line = json.loads(JsonFormatter().format(record))
    assert line["name"] == "x" * CLIP + "… (100000 characters)"
    assert line["duration_ms"] == 1.5


async def test_calls_are_kept_in_order_and_handed_to_subscribers_once() -> None:
    async with (
        serving_upstream(echo_server()) as url,
        running_gateway({"upstreams": {"alpha": {"url": url}}}) as gw,
    ):
        seen: list[Call] = []
        gw.gateway.activity.subscribe(seen.append)
        async with Client(gw.url, mode="legacy") as client:
            for text in ("one", "two", "three"):
                await client.call_tool("alpha__echo", {"text": text})
        kept = list(gw.gateway.activity.calls)
    assert kept == seen
    assert [c.outcome for c in kept] == ["ok", "ok", "ok"]
    assert len({c.session for c in kept}) == 1
    assert kept[0].session is not None


async def test_a_call_refused_by_the_rate_limit_is_recorded_as_refused() -> None:
    token = "burst-token-0123456789abcdef"
    config = {
        "upstreams": {"counter": python_upstream("counter.py")},
        "auth": {
            "mode": "bearer",
            "tokens": [{"name": "burst", "token": token, "policy": "limited"}],
            "policies": {"limited": {"rate_limit": {"per_minute": 1, "burst": 4}}},
        },
    }
    async with (
        running_gateway(config) as gw,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client,
    ):
        # initialize, notifications/initialized, the client's own output-schema lookup: one left
        await client.list_tools()
        await client.call_tool("counter__increment", {})
        with pytest.raises(MCPError):
            await client.call_tool("counter__increment", {})
        refused = gw.gateway.activity.calls[-1]
    assert (refused.client, refused.name, refused.outcome) == ("burst", "counter__increment", "refused")
    assert refused.detail is not None
    assert "rate limit exceeded for client 'burst'" in refused.detail


async def test_a_failed_agent_run_logs_its_reason_and_is_kept_with_its_steps(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    model = ScriptedChatModel(
        script=[calls(call("counter__increment")), calls(call("counter__increment", by="x"))] * 2
    )
    config = {
        "upstreams": {"counter": python_upstream("counter.py")},
        "agent": {"max_steps": 3, "memory": {"store": "memory"}},
    }
    async with running_gateway(config, chat_model=model) as gw, Client(gw.url, mode="legacy") as client:
        result = await client.call_tool("ask_agent", {"query": "count twice"})
        [run] = gw.gateway.activity.runs
    assert result.is_error
    assert (run.status, run.client, run.model_turns) == ("failed", "anonymous", 3)
    assert [(s.name, s.is_error) for s in run.steps] == [
        ("counter__increment", False),
        ("counter__increment", True),
    ]
    assert run.error is not None
    assert "step limit" in run.error
    [ended] = [r.getMessage() for r in caplog.records if f"agent run {run.run_id} failed" in r.getMessage()]
    assert ended.endswith(run.error)
    assert gw.gateway.activity.calls[-1].name == "ask_agent"


def test_a_client_supplied_name_is_kept_on_one_bounded_line() -> None:
    assert cut("x" * 1000, 10) == "x" * 9 + "…"
    assert cut("two\nlines") == "two lines"
