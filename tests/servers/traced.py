"""An upstream with its own OpenTelemetry SDK, exporting OTLP/HTTP to ``OTEL_EXPORTER_OTLP_ENDPOINT``.

Run as a separate process: ``traced.py stdio`` or ``traced.py http PORT`` (Streamable HTTP on
127.0.0.1:PORT at /mcp). FastMCP opens a SERVER span per request, continuing the trace carried
in the request's ``_meta.traceparent``; ``echo`` opens a child ``echo-work`` span inside it.
Spans are flushed when the process ends: stdin closing (stdio), or SIGTERM / SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from fastmcp import FastMCP
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

server = FastMCP("traced", instructions="Traces its work.")


@server.tool
async def echo(text: str) -> str:
    """Return ``text``, doing the work inside a child span called ``echo-work``."""
    with trace.get_tracer("traced").start_as_current_span("echo-work") as span:
        span.set_attribute("echo.length", len(text))
        return text


@server.tool
async def fail() -> str:
    """Always raises ValueError("boom")."""
    raise ValueError("boom")


@server.tool
def freeze() -> str:
    """Stop the whole process (SIGSTOP): no answer, no pings, until the gateway kills it."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return "thawed"


def _tracing() -> TracerProvider:
    service = os.environ.get("OTEL_SERVICE_NAME", "traced-upstream")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=100))
    trace.set_tracer_provider(provider)
    return provider


def _exit(signum: int, frame: FrameType | None) -> None:
    # Unwind (through the ``finally`` that flushes spans) instead of dying on the spot.
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> None:
    provider = _tracing()
    # uvicorn captures SIGTERM/SIGINT while serving, then restores these and re-raises the signal.
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    try:
        if argv[:1] == ["http"]:
            server.run(
                transport="http",
                host="127.0.0.1",
                port=int(argv[1]),
                path="/mcp",
                show_banner=False,
                log_level="WARNING",
            )
        else:  # stdio: ends when stdin closes
            server.run(transport="stdio", show_banner=False, log_level="WARNING")
    finally:
        provider.shutdown()  # flushes the batch processor


if __name__ == "__main__":
    main(sys.argv[1:])
