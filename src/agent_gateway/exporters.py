"""Where telemetry goes: the OpenTelemetry SDK's providers, OTLP export, Prometheus ``/metrics``.

``install`` runs once per process (the SDK's providers are process-global, and so are the
``mcp`` and FastMCP tracers that share them). The standard ``OTEL_*`` variables win over the
``telemetry:`` block; with no endpoint anywhere, no trace is recorded or exported, and the
gateway still passes its callers' trace context on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.sdk.environment_variables import OTEL_METRICS_EXEMPLAR_FILTER
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from agent_gateway import trace_context
from agent_gateway.config import TelemetryConfig
from agent_gateway.errors import ConfigError
from agent_gateway.telemetry import UpstreamSpans

logger = logging.getLogger(__name__)
MAX_ATTRIBUTE_LENGTH = 1024
_ATTRIBUTE_LENGTH_VARIABLES = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")


@dataclass(frozen=True)
class Settings:
    """The telemetry settings in effect: the config, overridden by ``OTEL_*`` variables."""

    service_name: str
    endpoint: str | None
    headers: dict[str, str]
    sampling_ratio: float
    metrics: bool
    disabled: bool
    attribute_length: int | None = None
    """The longest attribute value a span keeps (None: the standard variables' own)."""

    @classmethod
    def of(cls, config: TelemetryConfig, environ: Mapping[str, str]) -> Settings:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or config.otlp_endpoint
        ratio = config.sampling_ratio
        if raw := environ.get("OTEL_TRACES_SAMPLER_ARG"):
            try:
                ratio = min(max(float(raw), 0.0), 1.0)
            except ValueError:
                raise ConfigError(
                    f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is not a number between 0 and 1"
                ) from None
        return cls(
            service_name=environ.get("OTEL_SERVICE_NAME") or config.service_name,
            endpoint=endpoint.rstrip("/") if endpoint else None,
            headers=_headers(environ.get("OTEL_EXPORTER_OTLP_HEADERS")) or dict(config.otlp_headers),
            sampling_ratio=ratio,
            metrics=config.metrics and environ.get("OTEL_METRICS_EXPORTER", "") != "none",
            disabled=environ.get("OTEL_SDK_DISABLED", "").lower() == "true",
            # A client's values (its session id, up to a header's 64 KiB) are attributes: each
            # was kept whole in the export queue's 2,048 spans. The standard variables win.
            attribute_length=None
            if any(name in environ for name in _ATTRIBUTE_LENGTH_VARIABLES)
            else MAX_ATTRIBUTE_LENGTH,
        )


@dataclass
class Installed:
    """The providers this process exports through; ``shutdown`` flushes what is pending."""

    settings: Settings
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    prometheus: bool

    def shutdown(self) -> None:
        """Flush and stop, within ``SHUTDOWN_TIMEOUT`` seconds however the collector fares (an
        unreachable one would hold the exit for the exporters' retries: ~24 s)."""
        steps = [p.shutdown for p in (self.tracer_provider, self.meter_provider) if p is not None]
        if not steps:
            return
        done = threading.Thread(
            target=lambda: [step() for step in steps], name="telemetry-shutdown", daemon=True
        )
        done.start()
        done.join(SHUTDOWN_TIMEOUT)
        if done.is_alive():
            logger.warning(
                "telemetry: the collector did not take the last data within %gs; exiting", SHUTDOWN_TIMEOUT
            )


SHUTDOWN_TIMEOUT = 5.0
_EXPORT_TIMEOUT = 5.0


_installed: Installed | None = None


def install(config: TelemetryConfig, environ: Mapping[str, str], *, scraped: bool) -> Installed:
    """Set up this process's providers from ``config`` (once: later calls return the first).
    ``scraped``: the process serves ``/metrics`` (the HTTP transport; not stdio, not ``ask``),
    so metrics are kept for it; without it they are made only for an OTLP endpoint."""
    global _installed
    if _installed is not None:
        return _installed
    settings = Settings.of(config, environ)
    resource = Resource.create({"service.name": settings.service_name})
    tracing = None if settings.disabled or settings.endpoint is None else _tracer_provider(settings, resource)
    wanted = settings.metrics and not settings.disabled
    meters = (
        _meter_provider(settings, resource, traced=tracing is not None, environ=environ, scraped=scraped)
        if wanted and (scraped or settings.endpoint is not None)
        else None
    )
    if tracing is not None:
        trace.set_tracer_provider(tracing)
        trace_context.tracing.installed()
    if meters is not None:
        metrics.set_meter_provider(meters)
    _installed = Installed(settings, tracing, meters, prometheus=meters is not None and scraped)
    logger.info(
        "telemetry: traces %s, metrics %s",
        f"to {_where(settings.endpoint)} (sampling {settings.sampling_ratio:g})" if tracing else "off",
        _metrics_said(wanted, scraped=scraped, exported=settings.endpoint is not None),
    )
    return _installed


def _metrics_said(wanted: bool, *, scraped: bool, exported: bool) -> str:
    """Where metrics go, as the start-up line says it: ``/metrics`` only where it is served."""
    where = [name for name, on in (("/metrics", scraped), ("OTLP", exported)) if on]
    if not wanted:
        return "off"
    if not where:
        return "off (/metrics is served over HTTP only, and no OTLP endpoint is set)"
    return ("on " if scraped else "to ") + " and ".join(where)


def installed() -> Installed | None:
    return _installed


def _tracer_provider(settings: Settings, resource: Resource) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    limits = SpanLimits(max_attribute_length=settings.attribute_length)  # the variables' too
    provider = TracerProvider(
        resource=resource,
        sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
        span_limits=limits,
    )
    provider.add_span_processor(UpstreamSpans(limits.max_span_attribute_length))
    exporter = OTLPSpanExporter(
        endpoint=f"{settings.endpoint}/v1/traces", headers=settings.headers, timeout=_EXPORT_TIMEOUT
    )
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
    return provider


def _meter_provider(
    settings: Settings, resource: Resource, *, traced: bool, environ: Mapping[str, str], scraped: bool
) -> MeterProvider:
    readers: list[MetricReader] = []
    if scraped:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    if settings.endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(
            endpoint=f"{settings.endpoint}/v1/metrics", headers=settings.headers, timeout=_EXPORT_TIMEOUT
        )
        readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=15_000))
    # Exemplars link a measurement to the span it was made in, so without tracing there are
    # none to take; the SDK's default filter still looks for a span on every measurement (a
    # third of a histogram's cost). OTEL_METRICS_EXEMPLAR_FILTER, when set, decides.
    untraced = not traced and OTEL_METRICS_EXEMPLAR_FILTER not in environ
    exemplars = AlwaysOffExemplarFilter() if untraced else None
    return MeterProvider(resource=resource, metric_readers=readers, exemplar_filter=exemplars)


def _where(endpoint: str | None) -> str:
    """An endpoint as logged: scheme, host and port only (no credentials, no path)."""
    parts = urlsplit(endpoint or "")
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def _headers(raw: str | None) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS``: ``key=value`` pairs, comma-separated."""
    pairs = (item.split("=", 1) for item in (raw or "").split(",") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}
