"""One trace from the client through the gateway (and its agent) into upstream servers, each a
process of its own with its own OpenTelemetry SDK, all exporting over real OTLP/HTTP to a
receiver the test runs; ``/metrics`` counts; and no secret in any span, label or log line."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
import yaml
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.types import ASGIApp, Receive, Scope, Send

import agent_gateway
from agent_gateway.telemetry import PROMETHEUS_METRICS
from tests.agent.model_apis import Turn, openai_api
from tests.otlp import Received, SpanSeen, otlp_receiver
from tests.replicas.services import Redis
from tests.servers import recorder
from tests.support import (
    SERVERS,
    child_process,
    free_port,
    gateway_env,
    running_gateway,
    serving,
)

API_KEY = "sk-otel-secret-1234567890"
UPSTREAM_TOKEN = "tok-otel-secret-abcdef"
BOUND = 30.0


async def until_ready(url: str, any_answer: bool = False) -> None:
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(BOUND):
            while True:
                try:
                    if (await http.get(url)).status_code == 200 or any_answer:
                        return
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.05)


@dataclass
class Traced:
    """The running parts: the gateway's URL and log, the receiver, the model API."""

    gateway: str
    log: Path
    received: Received
    upstream_port: int


@asynccontextmanager
async def traced_gateway(
    tmp_path: Path, turns: list[Turn], store: str | None = None, **pipe: dict[str, float]
) -> AsyncIterator[Traced]:
    """Upstream ``web`` (HTTP) and ``pipe`` (stdio, with ``pipe`` as extra config), both
    ``tests/servers/traced.py``, behind a gateway process whose agent uses a scripted
    OpenAI-compatible endpoint (and a shared ``store`` when given, a Redis URL); all export
    to one OTLP receiver. Leaving stops the processes, which flushes their spans."""
    app, _ = openai_api(turns)
    async with otlp_receiver() as (endpoint, received), serving(app) as model_api:
        traced = [sys.executable, str(SERVERS / "traced.py")]
        web_port, port = free_port(), free_port()
        config = {
            "server": {"port": port},
            "upstreams": {
                "web": {
                    "url": f"http://127.0.0.1:{web_port}/mcp",
                    "headers": {"Authorization": "Bearer ${UPSTREAM_TOKEN}"},
                },
                "pipe": {
                    "command": sys.executable,
                    "args": traced[1:],
                    "env": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "pipe-upstream"},
                    **pipe,
                },
            },
            "agent": {
                "model": {
                    "provider": "openai",
                    "model": "gpt-test",
                    "base_url": f"{model_api}/v1",
                    "api_key": "${API_KEY}",
                },
                "memory": {"store": "memory"},
            },
            "telemetry": {"otlp_endpoint": endpoint, "log_format": "json"},
            **({"store": {"url": store}} if store is not None else {}),
        }
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**gateway_env(), "API_KEY": API_KEY, "UPSTREAM_TOKEN": UPSTREAM_TOKEN}
        web_env = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "web-upstream"}
        gateway = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(path)]
        log = tmp_path / "gateway.log"
        async with child_process([*traced, "http", str(web_port)], web_env, tmp_path / "web.log"):
            await until_ready(f"http://127.0.0.1:{web_port}/mcp", any_answer=True)
            async with child_process(gateway, env, log):
                await until_ready(f"http://127.0.0.1:{port}/readyz")
                yield Traced(f"http://127.0.0.1:{port}", log, received, web_port)


@asynccontextmanager
async def client_span(endpoint: str) -> AsyncIterator[trace.Span]:
    """A span of the test's own (a provider of its own, not the process's), made current so
    the ``mcp`` client puts its context in each request's ``_meta``."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-client"}))
    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    try:
        with provider.get_tracer("tests").start_as_current_span("client request") as span:
            yield span
    finally:
        # Off the event loop: the receiver in this process must answer the last export.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(provider.shutdown)


def one(spans: list[SpanSeen], service: str, name: str, parent: SpanSeen | None = None) -> SpanSeen:
    found = [s for s in spans if s.service == service and s.name == name]
    if parent is not None:
        found = [s for s in found if s.parent_id == parent.span_id]
    assert len(found) == 1, (service, name, [(s.service, s.name, s.parent_id) for s in spans])
    return found[0]


async def test_a_clients_trace_runs_unbroken_through_the_gateway_into_http_and_stdio_upstreams(
    tmp_path: Path,
) -> None:
    async with otlp_receiver() as (client_endpoint, client_received):
        async with (
            traced_gateway(tmp_path, []) as traced,
            client_span(client_endpoint) as root,
            Client(f"{traced.gateway}/mcp", mode="legacy") as client,
        ):
            web = await client.call_tool("web__echo", {"text": "over http"})
            pipe = await client.call_tool("pipe__echo", {"text": "over stdio"})
            failed = await client.call_tool("web__fail", {})
        trace_id = format(root.get_span_context().trace_id, "032x")
        spans = await traced.received.wait_for(
            lambda s: (
                len([x for x in s if x.name == "echo-work" and x.trace_id == trace_id]) == 2
                and any(x.name == "tools/call web__fail" for x in s)
            )
        )
        await client_received.wait_for(lambda s: any(x.name == "client request" for x in s))
    assert not web.is_error
    assert not pipe.is_error
    assert failed.is_error
    ours = [s for s in spans if s.trace_id == trace_id]
    client = format(root.get_span_context().span_id, "016x")
    for public, service, port in (
        ("web", "web-upstream", traced.upstream_port),
        ("pipe", "pipe-upstream", None),
    ):
        served = one(ours, "agent-gateway", f"tools/call {public}__echo")
        assert (served.kind, served.parent_id) == ("SERVER", client)
        assert served.attributes["mcp.method.name"] == "tools/call"
        assert served.attributes["gen_ai.tool.name"] == f"{public}__echo"
        assert served.attributes["agent_gateway.upstream"] == public
        assert served.attributes["mcp.session.id"]
        assert "jsonrpc.request.id" in served.attributes
        sent = one(ours, "agent-gateway", "tools/call echo", parent=served)
        assert sent.kind == "CLIENT"
        assert sent.attributes["agent_gateway.upstream"] == public
        assert sent.attributes.get("server.port") == port
        upstream = one(ours, service, "tools/call echo", parent=sent)
        assert upstream.kind == "SERVER"
        one(ours, service, "echo-work", parent=upstream)
    failure = one(ours, "agent-gateway", "tools/call web__fail")
    assert (failure.status_code, failure.attributes["error.type"]) == ("ERROR", "tool_error")
    _assert_no_secret(spans, traced.log.read_text())


async def test_an_agent_run_is_one_trace_of_agent_model_and_tool_spans_down_to_the_upstream(
    tmp_path: Path,
) -> None:
    turns = [Turn(calls=[("web__echo", {"text": "from the agent"})]), Turn(text="It said: from the agent")]
    async with traced_gateway(tmp_path, turns) as traced:
        async with Client(f"{traced.gateway}/mcp", mode="legacy") as client:
            result = await client.call_tool("ask_agent", {"query": "Echo something."})
        spans = await traced.received.wait_for(lambda s: any(x.name == "echo-work" for x in s))
    assert not result.is_error
    served = one(spans, "agent-gateway", "tools/call ask_agent")
    run = one(spans, "agent-gateway", "invoke_agent ask_agent", parent=served)
    assert run.attributes["agent_gateway.outcome"] == "answered"
    chats = [s for s in spans if s.name == "chat gpt-test" and s.parent_id == run.span_id]
    assert len(chats) == 2
    assert all(s.kind == "CLIENT" and s.attributes["gen_ai.provider.name"] == "openai" for s in chats)
    assert sorted(int(str(s.attributes["gen_ai.usage.output_tokens"])) for s in chats) == [7, 7]
    tool = one(spans, "agent-gateway", "execute_tool web__echo", parent=run)
    sent = one(spans, "agent-gateway", "tools/call echo", parent=tool)
    upstream = one(spans, "web-upstream", "tools/call echo", parent=sent)
    assert len({s.trace_id for s in (served, run, *chats, tool, sent, upstream)}) == 1
    # The gateway's log lines are JSON, and those written during the run carry its ids.
    lines = [json.loads(line) for line in traced.log.read_text().splitlines() if line.startswith("{")]
    started = [
        line for line in lines if line["message"].startswith("agent run ") and "started" in line["message"]
    ]
    assert [(line["trace_id"], line["span_id"]) for line in started] == [(run.trace_id, run.span_id)]
    _assert_no_secret(spans, traced.log.read_text())


async def test_metrics_count_each_call_by_tool_and_upstream_with_no_secret_in_a_label(
    tmp_path: Path, redis: Redis
) -> None:
    # The pipe upstream fails its health check and opens its circuit on the first lost call,
    # the agent runs once, and a shared store is set, so every instrument shows on /metrics.
    pipe = {"health": {"interval": 0.2, "timeout": 2}, "breaker": {"failures": 1, "reset": 30}}
    async with traced_gateway(tmp_path, [Turn(text="done")], store=redis.url, **pipe) as traced:
        async with Client(f"{traced.gateway}/mcp", mode="legacy") as client:
            for _ in range(3):
                await client.call_tool("web__echo", {"text": "x"})
            await client.call_tool("pipe__fail", {})
            with contextlib.suppress(MCPError):  # a made-up name: its own span, but no series
                await client.call_tool("made_up_tool", {})
            with contextlib.suppress(MCPError):  # longer than any public name: refused, counted
                await client.call_tool("x" * 65, {})
            frozen = await client.call_tool("pipe__freeze", {})
            asked = await client.call_tool("ask_agent", {"query": "anything"})
        async with Client(f"{traced.gateway}/mcp", mode="auto") as modern:  # forwarded below the SDK
            await modern.call_tool("web__fail", {})
        scraped = await scraped_once(f"{traced.gateway}/metrics", lambda text: "reconnects_total{" in text)
    assert frozen.is_error
    assert not asked.is_error
    # The agent's one model call, its tokens by type (the scripted API counts 11 in, 7 out).
    usage = re.findall(
        r'^gen_ai_client_token_usage_sum\{.*gen_ai_token_type="(\w+)".*\} (\S+)$', scraped, re.M
    )
    assert len(usage) == 2, usage
    assert {kind: float(total) for kind, total in usage} == {"input": 11, "output": 7}
    # The same metrics went out over OTLP too (at the latest when the gateway stopped).
    exported = await traced.received.wait_for_metrics(lambda m: len(m) > 0)
    names = {m.name for e in exported for r in e.resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert {"mcp.server.operation.duration", "mcp.client.operation.duration"} <= names
    server = _samples(scraped, "mcp_server_operation_duration_seconds_count")
    assert server[("tools/call", "web__echo", "web", "")] == 3
    assert server[("tools/call", "pipe__fail", "pipe", "tool_error")] == 1
    sent = _samples(scraped, "mcp_client_operation_duration_seconds_count")
    assert sent[("tools/call", "echo", "web", "")] == 3
    assert sent[("tools/call", "fail", "pipe", "tool_error")] == 1
    assert sent[("tools/call", "fail", "web", "tool_error")] == 1
    # Which way each went out: to the (modern) HTTP upstream below the SDK, whatever the
    # client's era; to the stdio one through the SDK's client.
    paths = re.findall(r"^mcp_client_operation_duration_seconds_count\{(.*)\} \S+$", scraped, re.M)
    direct = {p for p in paths if 'agent_gateway_path="direct"' in p}
    assert {'agent_gateway_upstream="web"' in p for p in direct} == {True}
    assert {'gen_ai_tool_name="echo"' in p or 'gen_ai_tool_name="fail"' in p for p in direct} == {True}
    assert len(direct) == 2  # the handshake-era client's echo, the modern one's fail
    assert any('agent_gateway_upstream="pipe"' in p and 'agent_gateway_path="sdk"' in p for p in paths)
    assert 'agent_gateway_upstream_up{agent_gateway_upstream="web"' in scraped
    assert "agent_gateway_sessions_active" in scraped
    assert re.search(r"^agent_gateway_store_available\{.*\} 1\.0$", scraped, re.M)
    # Every call sent nothing before its result: each was answered with one JSON body, the
    # modern client's in its POST's task too (compat/exchange.py).
    series = re.findall(r"^agent_gateway_http_answers_total\{(.*)\} (\S+)$", scraped, re.M)
    answers = {labels: float(count) for labels, count in series}
    assert all('form="json"' in labels for labels in answers), answers
    modern = sum(count for labels, count in answers.items() if 'mcp_era="modern"' in labels)
    assert sum(answers.values()) - modern >= 5
    assert modern >= 1
    assert "made_up_tool" not in scraped
    assert API_KEY not in scraped
    assert UPSTREAM_TOKEN not in scraped
    assert_the_metric_list_is_what_metrics_serves(scraped)


async def scraped_once(url: str, ready: Callable[[str], bool]) -> str:
    """``/metrics`` once ``ready`` holds for it (a reconnect is counted when it is done)."""
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(BOUND):
            while not ready(text := (await http.get(url)).text):
                await anyio.sleep(0.05)
    return text


# Families that prometheus_client and the OpenTelemetry exporter add of their own.
_LIBRARY_FAMILIES = re.compile(r"^(?:python_|process_|target_info$)")
_INSTRUMENT = re.compile(r"\bcreate_(?:\w+)\(\s*\"([\w.]+)\"")


def assert_the_metric_list_is_what_metrics_serves(scraped: str) -> None:
    """``PROMETHEUS_METRICS`` (which the dashboard test holds the dashboard to) is exactly
    the gateway's families on a real ``/metrics``, and every instrument the source creates
    is among them: a new metric fails here until the list (and so the dashboard) has it."""
    served = {
        name for name in re.findall(r"^# TYPE (\S+) \w+$", scraped, re.M) if not _LIBRARY_FAMILIES.match(name)
    }
    assert served == set(PROMETHEUS_METRICS), (
        f"exported but not listed: {served - PROMETHEUS_METRICS}; "
        f"listed but not exported: {PROMETHEUS_METRICS - served}"
    )
    source = Path(agent_gateway.__file__).parent
    created = {m for path in source.rglob("*.py") for m in _INSTRUMENT.findall(path.read_text())}
    assert created
    unseen = {
        name
        for name in created
        if not any(f == name.replace(".", "_") or f.startswith(name.replace(".", "_") + "_") for f in served)
    }
    assert not unseen, f"instruments this test never made show on /metrics: {unseen}"


async def test_a_gateway_with_no_telemetry_still_passes_the_callers_context_upstream_in_meta_and_headers() -> (
    None
):
    headers: list[dict[str, str]] = []
    upstream = recorder.build(lambda _: None).http_app(path="/mcp")
    async with (
        serving(_recording_headers(upstream, headers)) as base,
        running_gateway({"upstreams": {"rec": {"url": f"{base}/mcp"}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        provider = TracerProvider()
        with provider.get_tracer("tests").start_as_current_span("client request") as root:
            result = await client.call_tool("rec__whoami", {})
    trace_id = format(root.get_span_context().trace_id, "032x")
    assert result.structured_content is not None
    meta = result.structured_content["meta"]
    assert meta["traceparent"].split("-")[1] == trace_id, meta
    sent = [h["traceparent"] for h in headers if "traceparent" in h]
    assert [v.split("-")[1] for v in sent] == [trace_id], headers


def _recording_headers(app: ASGIApp, headers: list[dict[str, str]]) -> ASGIApp:
    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    return recording


def _samples(text: str, family: str) -> dict[tuple[str, str, str, str], float]:
    """``family``'s samples keyed by (method, tool, upstream, error type)."""
    out: dict[tuple[str, str, str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith(family + "{"):
            continue
        labels_text, value = line[len(family) + 1 :].rsplit("} ", 1)
        labels = dict(_label(pair) for pair in labels_text.split('",') if "=" in pair)
        key = (
            labels.get("mcp_method_name", ""),
            labels.get("gen_ai_tool_name", ""),
            labels.get("agent_gateway_upstream", ""),
            labels.get("error_type", ""),
        )
        out[key] = float(value)
    return out


def _label(pair: str) -> tuple[str, str]:
    name, value = pair.split("=", 1)
    return name.strip(), value.strip().strip('"')


def _assert_no_secret(spans: list[SpanSeen], log: str) -> None:
    for secret in (API_KEY, UPSTREAM_TOKEN):
        assert secret not in log
        for span in spans:
            assert secret not in span.name
            assert all(secret not in str(v) for v in span.attributes.values()), span


async def test_a_clients_long_names_are_cut_in_span_names_and_attributes(tmp_path: Path) -> None:
    # A span's name holds the prompt's name a client sends, which attribute limits do not
    # cut: 150 prompts/get of a 3.9 MB name held 700 MB with tracing on (a helper's attack,
    # stop 51). The name is refused (-32602), its span cut.
    name = "p" * 20_000
    async with (
        traced_gateway(tmp_path, []) as traced,
        Client(f"{traced.gateway}/mcp", mode="legacy") as client,
    ):
        with pytest.raises(MCPError):
            await client.get_prompt(name)
        spans = await traced.received.wait_for(lambda s: any(x.name.startswith("prompts/get pp") for x in s))
    [span] = [s for s in spans if s.name.startswith("prompts/get pp")]
    assert len(span.name) <= 200
    assert all(len(str(value)) <= 1024 for value in span.attributes.values())
