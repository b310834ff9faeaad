"""What the audit writer could not write, said once when writing fails, once when it resumes,
and in the trail itself: a record chained where the lost ones would have been, saying how
many (``audit.py`` writes it before the next record it can).

A write that fails (a full disk, a file past its size limit, a directory made read-only) is
cut back to the file's last whole record and tried again with a backoff; its records wait,
and the calls after them queue within ``audit.queue`` and 64 MiB, past which they are
dropped, counted. The gateway serves on meanwhile, ``/status`` saying the trail is failing.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("agent_gateway.audit")

RETRY_FIRST = 0.5
RETRY_MOST = 5.0
"""Seconds between tries of a write that failed: doubled from the first to the most."""


class Outage:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.problem: str | None = None
        """Why the trail cannot be written now (for ``/status``), or None: it can."""
        self.retry = RETRY_FIRST
        self._told = 0
        """Dropped records a gap record has said (``AuditLog.dropped`` counts them all)."""
        self._dropped_at = 0
        self._why = "the writer fell behind"

    def failed(self, exc: OSError, dropped: int) -> float:
        """A write failed: said once per outage. The seconds to wait before trying again."""
        why = exc.strerror or type(exc).__name__
        if self.problem is None:
            self._dropped_at = dropped
            logger.error(
                "audit: cannot write %s (%s): its records wait and are tried again; past audit.queue "
                "they are dropped, counted, and the trail says how many once it can be written",
                self.path,
                why,
            )
        else:
            self.retry = min(self.retry * 2, RETRY_MOST)
        self.problem, self._why = f"cannot be written ({self.path}: {why})", why
        return self.retry

    def resumed(self, dropped: int) -> None:
        """A write succeeded: said once if it had failed."""
        if self.problem is not None:
            logger.warning(
                "audit: writing %s again; %d records were dropped meanwhile",
                self.path,
                dropped - self._dropped_at,
            )
        self.problem, self.retry = None, RETRY_FIRST

    def gap(self, dropped: int, after: int) -> dict[str, Any] | None:
        """The record saying how many records were lost since the last one said, or None."""
        lost = dropped - self._told
        if lost <= 0:
            return None
        return {
            "time": time.time(),
            "client": None,
            "session": None,
            "method": "audit/gap",
            "name": None,
            "upstream": None,
            "outcome": "lost",
            "detail": f"{lost} records could not be written after record {after} ({self._why})",
            "duration_ms": 0.0,
            "trace_id": None,
            "arguments_sha256": None,
            "lost": lost,
        }

    def told(self, record: dict[str, Any]) -> None:
        """``record`` (a ``gap``) is in the file."""
        self._told += int(record["lost"])
        if self.problem is None:
            self._why = "the writer fell behind"
