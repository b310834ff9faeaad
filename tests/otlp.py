"""A tiny OTLP/HTTP (protobuf) receiver for tests: collects exported spans and metrics.

``otlp_receiver()`` serves it on loopback and yields ``(base_url, received)``; point
``OTEL_EXPORTER_OTLP_ENDPOINT`` at ``base_url`` (the exporters append ``/v1/traces`` and
``/v1/metrics`` themselves) and wait on ``received.wait_for(...)``.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tests.support import serving

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class SpanSeen:
    """One exported span, decoded into plain values."""

    service: str
    """The resource's ``service.name``."""
    name: str
    trace_id: str
    """32 lowercase hex digits."""
    span_id: str
    """16 lowercase hex digits."""
    parent_id: str | None
    """16 lowercase hex digits, or None for a root span."""
    kind: str
    """``SERVER``, ``CLIENT``, ``INTERNAL``, ``PRODUCER``, ``CONSUMER`` or ``UNSPECIFIED``."""
    attributes: dict[str, object]
    status_code: str
    """``UNSET``, ``OK`` or ``ERROR``."""
    status_message: str
    scope: str = ""
    """The instrumentation scope (tracer) name, e.g. ``fastmcp``."""
    events: tuple[str, ...] = ()
    """The names of the span's events, e.g. ``("exception",)``."""


def _value(value: AnyValue) -> object:
    match value.WhichOneof("value"):
        case "string_value":
            return value.string_value
        case "bool_value":
            return value.bool_value
        case "int_value":
            return value.int_value
        case "double_value":
            return value.double_value
        case "bytes_value":
            return value.bytes_value
        case "array_value":
            return [_value(item) for item in value.array_value.values]
        case "kvlist_value":
            return _attributes(value.kvlist_value.values)
        case _:
            return None


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, object]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _span(span: Span, service: str, scope: str) -> SpanSeen:
    return SpanSeen(
        service=service,
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex() or None,
        kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        attributes=_attributes(span.attributes),
        status_code=Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
        status_message=span.status.message,
        scope=scope,
        events=tuple(event.name for event in span.events),
    )


def spans_of(request: ExportTraceServiceRequest) -> list[SpanSeen]:
    """Every span in one export request, flattened."""
    seen: list[SpanSeen] = []
    for resource_spans in request.resource_spans:
        service = _attributes(resource_spans.resource.attributes).get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                seen.append(_span(span, str(service or ""), scope_spans.scope.name))
    return seen


@dataclass
class Received:
    """What the receiver has been sent so far."""

    spans: list[SpanSeen] = field(default_factory=list[SpanSeen])
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list[ExportMetricsServiceRequest])
    trace_requests: int = 0
    metric_requests: int = 0
    rejected: int = 0
    """Requests answered 400 (undecodable bodies)."""
    _changed: anyio.Event | None = field(default=None, init=False, repr=False)

    @property
    def requests(self) -> int:
        """Every export request received, accepted or not."""
        return self.trace_requests + self.metric_requests

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _until(self, ready: Callable[[], bool], seconds: float, what: Callable[[], str]) -> None:
        try:
            with anyio.fail_after(seconds):
                while not ready():
                    if self._changed is None:
                        self._changed = anyio.Event()
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(f"nothing satisfied the wait within {seconds}s; received {what()}") from None

    async def wait_for(
        self,
        predicate: Callable[[list[SpanSeen]], bool],
        timeout: float = 10.0,  # noqa: ASYNC109  # a bound on the wait, not the caller's own deadline
    ) -> list[SpanSeen]:
        """Wait until ``predicate(spans)`` holds (re-checked after each export); return the spans."""
        await self._until(
            lambda: predicate(self.spans),
            timeout,
            lambda: f"{len(self.spans)} spans: {[(s.service, s.name, s.kind) for s in self.spans]}",
        )
        return self.spans

    async def wait_for_metrics(
        self,
        predicate: Callable[[list[ExportMetricsServiceRequest]], bool],
        timeout: float = 10.0,  # noqa: ASYNC109  # a bound on the wait, not the caller's own deadline
    ) -> list[ExportMetricsServiceRequest]:
        """Wait until ``predicate(metrics)`` holds (re-checked after each export); return them."""
        await self._until(
            lambda: predicate(self.metrics), timeout, lambda: f"{len(self.metrics)} metric exports"
        )
        return self.metrics

    def named(self, name: str) -> list[SpanSeen]:
        """The spans called ``name``, in arrival order."""
        return [span for span in self.spans if span.name == name]


async def _body(request: Request) -> bytes:
    body = await request.body()
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding in ("", "identity"):
        return body
    raise ValueError(f"unsupported content-encoding {encoding!r}")


def _reject(received: Received, error: Exception) -> Response:
    received.rejected += 1
    received._notify()  # pyright: ignore[reportPrivateUsage]
    return PlainTextResponse(f"bad OTLP body: {error}", status_code=400)


def receiver_app(received: Received) -> Starlette:
    """An ASGI app answering OTLP/HTTP protobuf exports of traces and metrics."""

    async def traces(request: Request) -> Response:
        received.trace_requests += 1
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(await _body(request))
        except (DecodeError, OSError, EOFError, zlib.error, ValueError) as error:
            return _reject(received, error)
        received.spans.extend(spans_of(export))
        received._notify()  # pyright: ignore[reportPrivateUsage]
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

    async def metrics(request: Request) -> Response:
        received.metric_requests += 1
        export = ExportMetricsServiceRequest()
        try:
            export.ParseFromString(await _body(request))
        except (DecodeError, OSError, EOFError, zlib.error, ValueError) as error:
            return _reject(received, error)
        received.metrics.append(export)
        received._notify()  # pyright: ignore[reportPrivateUsage]
        return Response(ExportMetricsServiceResponse().SerializeToString(), media_type=PROTOBUF)

    return Starlette(
        routes=[
            Route("/v1/traces", traces, methods=["POST"]),
            Route("/v1/metrics", metrics, methods=["POST"]),
        ]
    )


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, Received]]:
    """Serve a receiver on loopback; yield its base URL (for OTEL_EXPORTER_OTLP_ENDPOINT) and log."""
    received = Received()
    async with serving(receiver_app(received)) as base:
        yield base, received
