"""The agent's GenAI spans and metrics: one span per run, per model call and per tool call."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry.trace import Span, SpanKind, StatusCode

from agent_gateway.telemetry import DURATION_BUCKETS, Outcome, meter, tracer

_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)

agent_runs = meter.create_counter("agent_gateway.agent.runs", description="ask_agent runs, by outcome.")
token_usage = meter.create_histogram(
    "gen_ai.client.token.usage",
    unit="{token}",
    description="Tokens per model call of the agent, by type and model.",
    explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
)
model_duration = meter.create_histogram(
    "gen_ai.client.operation.duration",
    unit="s",
    description="The agent's model calls, by model and error type.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)


@contextmanager
def agent_span(agent: str, run_id: str, thread: str) -> Iterator[Span]:
    """The span of one ``ask_agent`` run (``invoke_agent``), parent of its model and tool spans."""
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": thread,
        "agent_gateway.run_id": run_id,
    }
    with tracer.start_as_current_span(
        f"invoke_agent {agent}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span


def agent_finished(span: Span, outcome: str, error: str | None) -> None:
    """Record how a run ended on its span and in ``agent_gateway.agent.runs``."""
    agent_runs.add(1, {"agent_gateway.outcome": outcome})
    span.set_attribute("agent_gateway.outcome", outcome)
    if error is not None:
        span.set_attribute("error.type", "agent_error")
        span.set_status(StatusCode.ERROR, error)


@dataclass
class ModelCall:
    """One model call of the agent, filled in as it returns."""

    span: Span
    requested: str
    outcome: Outcome = field(default_factory=Outcome)

    def answered(self, model: str | None, input_tokens: int, output_tokens: int) -> None:
        if model:  # the reply's own name for it (with sampling, the client's say): span only
            self.span.set_attribute("gen_ai.response.model", model)
        self.span.set_attributes(
            {"gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens}
        )
        labels = {"gen_ai.request.model": self.requested}
        token_usage.record(input_tokens, {**labels, "gen_ai.token.type": "input"})
        token_usage.record(output_tokens, {**labels, "gen_ai.token.type": "output"})


@contextmanager
def chat_span(
    provider: str, model: str, pausing: tuple[type[BaseException], ...] = ()
) -> Iterator[ModelCall]:
    """A model call (``chat``); an exception of a ``pausing`` type ends it without error."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
    }
    started = time.perf_counter()
    with tracer.start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        call = ModelCall(span, model)
        try:
            with call.outcome.recorded(span, expected=pausing):
                yield call
        finally:
            labels = {"gen_ai.request.model": model, "gen_ai.provider.name": provider}
            model_duration.record(time.perf_counter() - started, call.outcome.labelled(labels))


@contextmanager
def tool_span(tool: str, upstream: str | None) -> Iterator[Outcome]:
    """One tool call of the agent (``execute_tool``), parent of the upstream request's span."""
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
    if upstream is not None:
        attributes["agent_gateway.upstream"] = upstream
    with tracer.start_as_current_span(
        f"execute_tool {tool}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        outcome = Outcome()
        with outcome.recorded(span):
            yield outcome
        if outcome.error_type is not None:
            span.set_attribute("error.type", outcome.error_type)
            span.set_status(StatusCode.ERROR)
