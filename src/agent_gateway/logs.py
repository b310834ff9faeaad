"""Log lines that name the trace they belong to: ids on every record, and a JSON format."""

from __future__ import annotations

import json
import logging
from typing import Any

from opentelemetry import trace


class TraceIds(logging.Filter):
    """Puts the current ``trace_id`` and ``span_id`` (hex, or empty) on every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else ""
        record.span_id = format(context.span_id, "016x") if context.is_valid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, trace and span ids, exception,
    and the fields a structured line carries (``extra={"fields": {...}}``)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "trace_id": getattr(record, "trace_id", ""),
            "span_id": getattr(record, "span_id", ""),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):  # structured lines (the access line) bring their own
            line.update(fields)  # pyright: ignore[reportUnknownArgumentType]
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)
