"""Trace context in and out: a caller's W3C trace context read from a request's ``_meta`` or
HTTP headers, and the one the ``mcp`` client writes into an upstream request's ``_meta``
copied into that POST's headers too (for upstreams and proxies that read only headers)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx2
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context

_CARRIER_KEYS = ("traceparent", "tracestate", "baggage")


class _Tracing:
    """Whether spans are being made: an SDK provider is installed. Until then every span is a
    no-op that only hands on its parent, so a path per call may skip making one.

    OpenTelemetry is asked at most once a second until a provider is there (its answer looks
    up an environment variable: 2.4 us, twice a call), and not again once one is: a global
    provider, once set, cannot be replaced. Providers are set at start-up, before serving;
    ``exporters.install`` says so at once (``installed``)."""

    def __init__(self) -> None:
        self._on = False
        self._asked = -math.inf

    def __call__(self) -> bool:
        if self._on:
            return True
        now = time.monotonic()
        if now - self._asked >= 1.0:
            self._asked = now
            provider = trace.get_tracer_provider()
            self._on = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
        return self._on

    def installed(self) -> None:
        """A provider was just set: spans are made from now on, not from the next asking."""
        self._on = True


tracing = _Tracing()


# -- trace context in ------------------------------------------------------------------------


def incoming_context(meta: object, headers: Mapping[str, str] | None) -> Context | None:
    """The caller's trace context: from ``_meta`` (also FastMCP's ``fastmcp.*`` keys), else
    from the HTTP request's headers; None when neither carries a valid ``traceparent``."""
    carrier = _meta_carrier(meta)
    if "traceparent" not in carrier and headers is not None:
        carrier = {k: headers[k] for k in _CARRIER_KEYS if k in headers}
    if "traceparent" not in carrier:
        return None
    # Onto the current context, so values already set in it (suppression markers) survive.
    extracted = propagate.extract(carrier, context=otel_context.get_current())
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None


def _meta_carrier(meta: object) -> dict[str, str]:
    if not isinstance(meta, Mapping):
        return {}
    carrier: dict[str, str] = {}
    for key in _CARRIER_KEYS:
        value = meta.get(key, meta.get(f"fastmcp.{key}"))  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(value, str):
            carrier[key] = value
    return carrier


# -- trace context out over HTTP -------------------------------------------------------------

_TRACE_FIELD = re.compile(rb'"traceparent"\s*:')


async def trace_headers(request: httpx2.Request) -> None:
    """An httpx event hook: the trace context the ``mcp`` client put in the body's ``_meta``
    also goes in the HTTP headers (the POST is sent from the transport's task, whose own
    context is not the request's)."""
    if request.method != "POST":
        return
    try:
        body = request.content
    except httpx2.RequestNotRead:
        return
    if not _TRACE_FIELD.search(body):
        return
    for key, value in carried(_body_meta(body)).items():
        if key not in request.headers:
            request.headers[key] = value


def carried(meta: Mapping[str, Any]) -> dict[str, str]:
    """The trace context a request's ``_meta`` carries, as the HTTP headers that carry it too."""
    return {key: value for key in _CARRIER_KEYS if isinstance(value := meta.get(key), str)}


def _body_meta(body: bytes) -> Mapping[str, Any]:
    try:
        message = json.loads(body)
    except ValueError:
        return {}
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else {}  # pyright: ignore[reportUnknownVariableType]
