"""Where the trace context and the telemetry settings come from: ``_meta`` before headers,
FastMCP's older keys too, and ``OTEL_*`` variables over the ``telemetry:`` block."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from opentelemetry import baggage, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from agent_gateway import exporters
from agent_gateway.config import TelemetryConfig
from agent_gateway.errors import ConfigError
from agent_gateway.exporters import (
    MAX_ATTRIBUTE_LENGTH,
    Installed,
    Settings,
    _tracer_provider,  # pyright: ignore[reportPrivateUsage]
)
from agent_gateway.trace_context import incoming_context

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE}-b7ad6b7169203331-01"
OTHER = "00-11111111111111111111111111111111-2222222222222222-01"


def trace_id(meta: object, headers: dict[str, str] | None = None) -> str | None:
    context = incoming_context(meta, headers)
    if context is None:
        return None
    return format(trace.get_current_span(context).get_span_context().trace_id, "032x")


def test_meta_wins_over_headers_and_fastmcps_keys_are_read_too() -> None:
    assert trace_id({"traceparent": PARENT}, {"traceparent": OTHER}) == TRACE
    assert trace_id({"fastmcp.traceparent": PARENT}) == TRACE
    assert trace_id({}, {"traceparent": PARENT}) == TRACE


def test_a_missing_or_malformed_traceparent_gives_no_context() -> None:
    assert trace_id(None) is None
    assert trace_id({"traceparent": "not-a-traceparent"}) is None
    assert trace_id({"traceparent": 42}) is None


def test_baggage_comes_with_the_context() -> None:
    context = incoming_context({"traceparent": PARENT, "baggage": "tenant=blue"}, None)
    assert context is not None
    assert baggage.get_baggage("tenant", context) == "blue"


def test_otel_variables_win_over_the_telemetry_block() -> None:
    config = TelemetryConfig(service_name="from-file", otlp_endpoint="http://file:4318", sampling_ratio=0.5)
    environ = {
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer x,tenant=blue",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    settings = Settings.of(config, environ)
    assert (settings.service_name, settings.endpoint, settings.sampling_ratio) == (
        "from-env",
        "http://env:4318",
        0.25,
    )
    assert settings.headers == {"authorization": "Bearer x", "tenant": "blue"}
    assert Settings.of(config, {}).endpoint == "http://file:4318"
    assert Settings.of(config, {"OTEL_SDK_DISABLED": "true"}).disabled


def test_metrics_are_off_when_the_config_or_the_standard_variable_says_so() -> None:
    # Either turns /metrics and the metrics' export off; neither turns them on over the other.
    assert Settings.of(TelemetryConfig(), {}).metrics
    assert not Settings.of(TelemetryConfig(metrics=False), {}).metrics
    assert not Settings.of(TelemetryConfig(), {"OTEL_METRICS_EXPORTER": "none"}).metrics
    assert not Settings.of(TelemetryConfig(metrics=False), {"OTEL_METRICS_EXPORTER": "otlp"}).metrics


def test_a_callers_sampling_decision_stands_whatever_the_ratio() -> None:
    # The ratio decides for the traces the gateway starts; a caller that sampled its trace
    # gets the gateway's spans in it at any ratio, and one that did not gets none.
    unsampled = PARENT[:-2] + "00"
    for ratio, parent, recorded in ((0.0, PARENT, True), (1.0, unsampled, False)):
        config = TelemetryConfig(otlp_endpoint="http://127.0.0.1:9", sampling_ratio=ratio)
        provider = _tracer_provider(Settings.of(config, {}), Resource.create({}))
        try:
            tracer = provider.get_tracer("t")
            caller = incoming_context({"traceparent": parent}, None)
            assert tracer.start_span("s", context=caller).is_recording() is recorded, ratio
            assert tracer.start_span("s").is_recording() is (ratio == 1.0), ratio  # a root: the ratio's
        finally:
            provider.shutdown()


def test_a_bad_sampler_argument_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER_ARG"):
        Settings.of(TelemetryConfig(), {"OTEL_TRACES_SAMPLER_ARG": "most"})


@pytest.mark.parametrize(
    ("environ", "kept"),
    [({}, MAX_ATTRIBUTE_LENGTH), ({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "10"}, 10)],
)
def test_a_spans_attribute_values_are_cut_to_a_bound_and_the_standard_variable_wins(
    environ: dict[str, str], kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client's values are attributes (its session id, up to a header's 64 KiB): each was
    # kept whole, in up to 2,048 spans waiting for export. Found by a helper's attack (stop 51).
    for name, value in environ.items():
        monkeypatch.setenv(name, value)  # the SDK reads the variable itself
    config = TelemetryConfig(otlp_endpoint="http://127.0.0.1:9")
    provider = _tracer_provider(Settings.of(config, environ), Resource.create({}))
    try:
        span = provider.get_tracer("t").start_span("s", attributes={"mcp.session.id": "x" * 60_000})
        span.end()
        assert isinstance(span, ReadableSpan)
        assert span.attributes is not None
        assert len(str(span.attributes["mcp.session.id"])) == kept
    finally:
        provider.shutdown()


def test_shutdown_waits_for_a_collector_that_never_answers_no_longer_than_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A collector that takes the connection and answers nothing (a partition, a hung host):
    # each provider's exporter waits out its own 5 s timeout, in turn, unless shutdown gives
    # up at its bound. (One that refuses the connection fails too fast to tell: the SIGTERM
    # test in tests/security/test_small_ones.py exits in time without the bound.)
    monkeypatch.setattr(exporters, "SHUTDOWN_TIMEOUT", 0.5)  # the bound, not its 5 s, is tested
    with socket.create_server(("127.0.0.1", 0)) as collector:
        config = TelemetryConfig(otlp_endpoint=f"http://127.0.0.1:{collector.getsockname()[1]}")
        settings = Settings.of(config, {})
        provider = _tracer_provider(settings, Resource.create({}))
        provider.get_tracer("t").start_span("s").end()
        started = time.monotonic()
        Installed(settings, provider, None, prometheus=False).shutdown()
        assert time.monotonic() - started < 3
        # The export given up on ends at its own timeout: here, not in a later test's logs.
        for thread in threading.enumerate():
            if thread.name == "telemetry-shutdown":
                thread.join(15)
                assert not thread.is_alive()
