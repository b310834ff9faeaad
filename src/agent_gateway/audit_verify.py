"""``agent-gateway audit verify``: the audit trail's chain checked, file by file (the trail
itself is written by ``audit.py``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
MAX_LINE = 2**20
"""The longest line read as one record: a record keeps at most 64 KiB of a call's arguments,
and the trail is resumed from a record in its last MiB (``audit.py``). A file of one endless
line (``/dev/zero``, a log written over the trail) was read into memory whole, never answered."""


def canonical_json(body: dict[str, Any]) -> str:
    """What a record's hash is of: sorted keys, no spaces, UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


@dataclass(frozen=True)
class Verdict:
    records: int
    problem: str | None = None
    """The first bad record (file, line, why), or None: the chain holds."""


def verify(paths: Iterable[Path]) -> Verdict:
    """Check the chain through ``paths`` (oldest first): every record's hash, its ``prev``
    against the record before it, and ``seq`` without gaps."""
    count, prev, seq = 0, None, None
    for path in paths:
        try:
            file = open(path, "rb")  # noqa: SIM115 (closed below, read line by line)
        except OSError as exc:
            return Verdict(count, f"{path}: cannot be read ({exc.strerror or type(exc).__name__})")
        with file:
            number = 0
            # A record of MAX_LINE bytes and its newline (the newline counted, one was refused
            # as a file's first line and read as its last).
            while line := file.readline(MAX_LINE + 2):
                number += 1
                where = f"{path}:{number}"
                if len(line.removesuffix(b"\n")) > MAX_LINE:
                    return Verdict(
                        count, f"{where}: a line of more than {MAX_LINE // 2**20} MiB, not a record"
                    )
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past reading
                    return Verdict(count, f"{where}: not a JSON record")
                problem = _record_problem(record, prev, seq)
                if problem is not None:
                    return Verdict(count, f"{where}: {problem}")
                count, prev, seq = count + 1, record["hash"], record["seq"]
    return Verdict(count)


def _record_problem(record: Any, prev: str | None, seq: int | None) -> str | None:
    if not isinstance(record, dict) or not {"hash", "prev", "seq"} <= record.keys():
        return "not an audit record (no hash, prev or seq)"
    if type(record["seq"]) is not int:  # pyright: ignore[reportUnknownArgumentType]
        return "not an audit record (its seq is not a record number)"
    body = {k: v for k, v in record.items() if k != "hash"}  # pyright: ignore[reportUnknownVariableType]
    try:
        edited = _hash(body) != record["hash"]  # pyright: ignore[reportUnknownArgumentType]
    except UnicodeEncodeError:  # a lone surrogate (``"\\ud800"``): the trail writes a '?' for one
        edited = True
    if edited:
        return "edited: its hash does not match its content"
    if prev is None:  # the first record read: the chain's start, or where the given files start
        if record["seq"] == 1 and record["prev"] != GENESIS:
            return "record 1 does not start the chain"
        return None
    if record["prev"] != prev:
        return f"does not follow the record before it (record {seq} was deleted, edited or another inserted)"
    if record["seq"] != (seq or 0) + 1:
        return f"is record {record['seq']} after record {seq}: records were deleted or inserted"
    return None
