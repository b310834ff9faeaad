"""OpenTelemetry for the gateway: MCP spans and metrics (trace context in and out: trace_context.py).

The gateway instruments through the OpenTelemetry API only; until ``install`` sets the SDK's
providers every span is a no-op that still carries the caller's context, so a trace passes
through an unconfigured gateway to the upstreams unbroken.

Spans, by the OpenTelemetry MCP semantic conventions:
- a SERVER span per request received (``RequestTelemetry``, entered by the one request
  wrapper, ``request_wrapper.py``; FastMCP's own per-request span is suppressed so there is one);
- a CLIENT span per request sent upstream: the ``mcp`` client's own span, which is the one
  whose context reaches the upstream in ``_meta``, renamed and given the upstream's name and
  address by ``UpstreamSpans`` from what ``upstream_call`` put in the context;
- the agent's GenAI spans (``agent/spans.py``).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from fastmcp.telemetry import suppress_fastmcp_telemetry
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.methods import SPEC_CLIENT_METHODS
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import Span, SpanKind, StatusCode
from pydantic import ValidationError

from agent_gateway.compat.opentelemetry import restatus
from agent_gateway.errors import GatewayError, error_type_of
from agent_gateway.requested import Requested
from agent_gateway.trace_context import incoming_context, tracing

PROMETHEUS_METRICS: frozenset[str] = frozenset(
    {
        "mcp_server_operation_duration_seconds",
        "mcp_client_operation_duration_seconds",
        "agent_gateway_upstream_up",
        "agent_gateway_upstream_reconnects_total",
        "agent_gateway_upstream_circuit_transitions_total",
        "agent_gateway_upstream_health_failures_total",
        "agent_gateway_sessions_active",
        "agent_gateway_http_answers_total",
        "agent_gateway_refusals_total",
        "agent_gateway_in_flight_bytes",
        "agent_gateway_audit_records_total",
        "agent_gateway_tools_changed",
        "agent_gateway_agent_runs_total",
        "agent_gateway_store_available",
        "agent_gateway_store_failures_total",
        "agent_gateway_store_events_dropped_total",
        "agent_gateway_store_notifications_relayed_total",
        "agent_gateway_store_notifications_unrelayed_total",
        "agent_gateway_store_sessions_restored_total",
        "gen_ai_client_token_usage",
        "gen_ai_client_operation_duration_seconds",
    }
)
"""The metric families ``/metrics`` exports (histograms add ``_bucket``, ``_count``, ``_sum``);
tests/test_telemetry.py holds it to a real scrape, and the dashboard test to the dashboard."""

SCOPE = "agent-gateway"
MCP_CLIENT_SCOPE = "mcp-python-sdk"  # the mcp package's tracer: its client spans are ours to enrich
# Seconds; the semantic conventions' advice for MCP and GenAI operation durations.
DURATION_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

tracer = trace.get_tracer(SCOPE)
meter = metrics.get_meter(SCOPE)
server_duration = meter.create_histogram(
    "mcp.server.operation.duration",
    unit="s",
    description="MCP requests the gateway served, by method, tool, upstream and error type.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
client_duration = meter.create_histogram(
    "mcp.client.operation.duration",
    unit="s",
    description="MCP requests the gateway sent upstream, by method, tool, upstream and error type.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
reconnects = meter.create_counter(
    "agent_gateway.upstream.reconnects", description="Upstream connections re-established after a loss."
)
breaker_transitions = meter.create_counter(
    "agent_gateway.upstream.circuit_transitions",
    description="Upstream circuit breaker changes, by the state entered (open, closed).",
)
health_failures = meter.create_counter(
    "agent_gateway.upstream.health_failures",
    description="Health pings an upstream failed to answer in time (each marks it down).",
)


_upstream_sources: weakref.WeakSet[UpstreamStates] = weakref.WeakSet()


class UpstreamStates(Protocol):
    up_states: Callable[[], list[tuple[str, bool]]]
    """(upstream name, whether it is up) for each upstream."""


def watch_upstreams(source: UpstreamStates) -> None:
    """Report ``source``'s upstreams in ``agent_gateway.upstream.up`` while it exists."""
    _upstream_sources.add(source)


def _observe_up(options: CallbackOptions) -> Iterable[Observation]:
    for source in list(_upstream_sources):
        for name, up in source.up_states():
            yield Observation(1 if up else 0, {"agent_gateway.upstream": name})


meter.create_observable_gauge(
    "agent_gateway.upstream.up", callbacks=[_observe_up], description="1 while an upstream is connected."
)
# -- server spans ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSpan:
    """The SERVER span of one request being served, and how it ended."""

    span: Span
    outcome: Outcome

    def answered(self, result: object) -> None:
        """The request was answered with ``result``: a tool's ``isError`` marks the span."""
        if _is_tool_error(result):
            self.outcome.fail(self.span, "tool_error", None)


class RequestTelemetry:
    """The SERVER span and duration metric of every request the gateway serves (entered by
    ``request_wrapper.RequestWrapper``, once per request)."""

    def __init__(self, own_tools: Callable[[], set[str]]) -> None:
        """``own_tools()``: the tools the gateway serves itself (``ask_agent``)."""
        self._own_tools = own_tools

    @contextmanager
    def spanned(
        self, ctx: ServerRequestContext[Any, Any], params: Mapping[str, Any], request: Requested
    ) -> Iterator[ServerSpan]:
        """Around one request (not a notification), for what ``request`` says it is for: its
        span, current inside, and its duration recorded when it ends, however it ends."""
        target, upstream = request.target, request.upstream
        # Labels only from what the gateway knows: a client's made-up names must not each
        # become a metric series (the span, which is not aggregated, keeps them).
        known = upstream is not None or (ctx.method == "tools/call" and target in self._own_tools())
        method = ctx.method if ctx.method in SPEC_CLIENT_METHODS else "_OTHER"
        labels = _labels(method, target if ctx.method in _NAMED and known else None, upstream)
        parent = incoming_context(params.get("_meta"), _headers(ctx.request))
        token = otel_context.attach(parent) if parent is not None else None
        started = time.perf_counter()
        outcome = Outcome()
        try:
            if not tracing():  # the span would be a no-op: its attributes and context go unmade
                with outcome.recorded(trace.INVALID_SPAN):
                    yield ServerSpan(trace.INVALID_SPAN, outcome)
                return
            with (
                suppress_fastmcp_telemetry(),
                tracer.start_as_current_span(
                    (f"{ctx.method} {target}" if ctx.method in _NAMED and target else ctx.method)[:_NAME_MAX],
                    kind=SpanKind.SERVER,
                    attributes=_server_attributes(ctx, params, target, upstream),
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span,
                outcome.recorded(span),
            ):
                yield ServerSpan(span, outcome)
        finally:
            if token is not None:
                otel_context.detach(token)
            server_duration.record(time.perf_counter() - started, outcome.labelled(labels))


_NAMED = ("tools/call", "prompts/get")
_NAME_MAX = 200
"""A span's name at most (a client's made-up prompt name is in it: attribute limits do not cut names)."""


def _server_attributes(
    ctx: ServerRequestContext[Any, Any], params: Mapping[str, Any], target: str | None, upstream: str | None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "mcp.method.name": ctx.method,
        "mcp.protocol.version": ctx.protocol_version,
        "jsonrpc.request.id": str(ctx.request_id),
        "network.transport": "tcp" if ctx.request is not None else "pipe",
    }
    headers = _headers(ctx.request)
    if headers is not None and (session := headers.get("mcp-session-id")):
        attributes["mcp.session.id"] = session
    if upstream is not None:
        attributes["agent_gateway.upstream"] = upstream
    if target is not None:
        attributes.update(_target_attributes(ctx.method, target))
    return attributes


def _target_attributes(method: str, target: str) -> dict[str, str]:
    if method == "tools/call":
        return {"gen_ai.tool.name": target, "gen_ai.operation.name": "execute_tool"}
    if method == "prompts/get":
        return {"gen_ai.prompt.name": target}
    return {"mcp.resource.uri": target}


def _headers(request: object) -> Mapping[str, str] | None:
    headers = getattr(request, "headers", None)
    return headers if isinstance(headers, Mapping) else None  # pyright: ignore[reportUnknownVariableType]


def _is_tool_error(result: object) -> bool:
    if isinstance(result, types.CallToolResult):
        return bool(result.is_error)
    return isinstance(result, Mapping) and result.get("isError") is True  # pyright: ignore[reportUnknownMemberType]


def _labels(method: str, tool: str | None, upstream: str | None) -> dict[str, str]:
    labels = {"mcp.method.name": method}
    if tool is not None:
        labels["gen_ai.tool.name"] = tool
    if upstream is not None:
        labels["agent_gateway.upstream"] = upstream
    return labels


@dataclass
class Outcome:
    """How an operation ended, for its span's status and its metric's ``error.type``."""

    error_type: str | None = None

    def fail(self, span: Span, error_type: str, message: str | None) -> None:
        self.error_type = error_type
        span.set_attribute("error.type", error_type)
        span.set_status(StatusCode.ERROR, message)

    def recorded(self, span: Span, expected: tuple[type[BaseException], ...] = ()) -> Recorded:
        """Record on ``span`` (and here) how the block ended, then let it end that way; an
        ``expected`` exception is not a failure (an agent run pausing for its client)."""
        return Recorded(self, span, expected)

    def labelled(self, labels: Mapping[str, str]) -> dict[str, str]:
        return {**labels, "error.type": self.error_type} if self.error_type else dict(labels)


class Recorded:
    """``Outcome.recorded``'s block: a class, not a generator, as it is entered twice a call."""

    __slots__ = ("_expected", "_outcome", "_span")

    def __init__(self, outcome: Outcome, span: Span, expected: tuple[type[BaseException], ...]) -> None:
        self._outcome, self._span, self._expected = outcome, span, expected

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, self._expected):
            return False
        outcome, span = self._outcome, self._span
        if isinstance(exc, MCPError):
            outcome.fail(span, error_type_of(exc.error.code), exc.error.message)
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            outcome.fail(span, "cancelled", "cancelled")
        elif isinstance(exc, ValidationError):
            outcome.fail(
                span, str(types.INVALID_PARAMS), "Invalid request parameters"
            )  # its text is client input
        elif isinstance(exc, Exception):
            # No stack trace: a chained provider error may hold what the message was scrubbed of.
            outcome.fail(span, type(exc).__qualname__, str(exc) if isinstance(exc, GatewayError) else None)
        return False


# -- client spans ----------------------------------------------------------------------------


@dataclass
class UpstreamCall:
    """The request being sent upstream in this context, for its span and metric."""

    upstream: str
    method: str
    target: str | None
    address: tuple[str, int | None] | None
    outcome: Outcome = field(default_factory=Outcome)
    path: str = "sdk"
    """How it went out: through the ``mcp`` client (``sdk``), or below it (``direct``,
    ``upstreams/forwarding.py``): a label on its duration, so a deployment sees which."""


_UPSTREAM_CALL: ContextVar[UpstreamCall | None] = ContextVar("agent_gateway_upstream_call", default=None)


@contextmanager
def upstream_call(upstream: str, method: str, target: str | None, url: str | None) -> Iterator[UpstreamCall]:
    """Around one request to ``upstream``: its span is enriched, its duration recorded."""
    call = UpstreamCall(upstream, method, target, _address(url))
    bound = _UPSTREAM_CALL.set(call)
    started = time.perf_counter()
    try:
        with call.outcome.recorded(trace.INVALID_SPAN):
            yield call
    finally:
        _UPSTREAM_CALL.reset(bound)
        labels = _labels(method, target if method in _NAMED else None, upstream)
        labels["agent_gateway.path"] = call.path
        client_duration.record(time.perf_counter() - started, call.outcome.labelled(labels))


def sent_directly() -> None:
    """The upstream request in this context goes out below the ``mcp`` client."""
    if (call := _UPSTREAM_CALL.get()) is not None:
        call.path = "direct"


@lru_cache(maxsize=256)  # one per configured upstream URL: parsed once, not on every call
def _address(url: str | None) -> tuple[str, int | None] | None:
    if url is None:
        return None
    parts = urlsplit(url)
    return (parts.hostname, parts.port) if parts.hostname else None


class UpstreamSpans(SpanProcessor):
    """Gives the ``mcp`` client's span of an upstream request its MCP name and the gateway's
    attributes (it is the span whose context the upstream receives, so it must be the one),
    and cuts every span's status description to ``limit`` characters, as its attributes are."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        call = _UPSTREAM_CALL.get()
        scope = span.instrumentation_scope
        if call is None or scope is None or scope.name != MCP_CLIENT_SCOPE or span.kind != SpanKind.CLIENT:
            return
        if (span.attributes or {}).get("mcp.method.name") != call.method:
            return  # another request the client made on its own (a re-list), not this call
        named = call.method in _NAMED and call.target is not None
        span.update_name(f"{call.method} {call.target}" if named else call.method)
        attributes: dict[str, Any] = {"agent_gateway.upstream": call.upstream}
        if call.target is not None:
            attributes.update(_target_attributes(call.method, call.target))
        if call.address is not None:
            attributes["server.address"] = call.address[0]
            if call.address[1] is not None:
                attributes["server.port"] = call.address[1]
        span.set_attributes(attributes)

    def on_end(self, span: ReadableSpan) -> None:
        # The SDK keeps a description whole (it is no attribute): the SDK client's span held an
        # upstream's whole error message, 2 MB a call, 2,048 such spans in the export queue.
        status, limit = span.status, self._limit
        if limit is not None and status.description is not None and len(status.description) > limit:
            restatus(span, f"{status.description[:limit]}… ({len(status.description)} characters)")


def mark_upstream_error(error_type: str) -> None:
    """The current upstream request ended in an error that is a result (``isError``)."""
    call = _UPSTREAM_CALL.get()
    if call is not None:
        call.outcome.error_type = error_type
