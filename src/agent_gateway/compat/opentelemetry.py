"""OpenTelemetry SDK internals the gateway uses: the one place they are touched.

``ReadableSpan._status``: an ended span's status, rewritten by a span processor's ``on_end``
before an exporter reads it (``set_status`` is refused once a span has ended, and the SDK
bounds attributes, never a status's description). ``tests/test_compat.py`` checks that
``status`` still reads what is written there.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Status


def restatus(span: ReadableSpan, description: str) -> None:
    """``span``'s status, ended or not, with ``description`` in place of its own."""
    span._status = Status(span.status.status_code, description)  # pyright: ignore[reportPrivateUsage]
