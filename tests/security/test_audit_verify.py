"""``agent-gateway audit verify`` given a file that is no audit trail answers in one line, as it
does a missing file: a file of one endless line (``/dev/zero``, a log written over the trail)
was read into memory whole and never answered; a line that is not UTF-8, one nested past
reading, and a record whose ``seq`` is no number each ended it in a traceback. Found by a
helper's attack (round AU)."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from agent_gateway.audit_verify import GENESIS

MEMORY = 3 * 2**30
"""The address space the command is run in: an endless line read whole ends on it at once."""


def verified(*files: str) -> subprocess.CompletedProcess[str]:
    """``audit verify`` run as the operator runs it, in a process of bounded memory."""

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    command = "from agent_gateway.cli import main; raise SystemExit(main())"
    return subprocess.run(
        [sys.executable, "-c", command, "audit", "verify", *files],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        preexec_fn=bounded,
        timeout=120,
    )


def record(seq: object, prev: str) -> str:
    body = {"event": "call", "prev": prev, "seq": seq}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return json.dumps({**body, "hash": digest})


def chain(*seqs: object) -> bytes:
    """Records of ``seqs``, each following the one before (their hashes are right)."""
    lines, prev = [], GENESIS
    for seq in seqs:
        lines.append(line := record(seq, prev))
        prev = json.loads(line)["hash"]
    return "".join(f"{line}\n" for line in lines).encode()


def test_an_endless_line_is_read_no_further_than_a_record_can_be_long() -> None:
    answer = verified("/dev/zero")
    assert answer.returncode == 1, answer.stderr[-500:]
    assert "Traceback" not in answer.stderr
    expected = "/dev/zero:1: a line of more than 1 MiB, not a record"
    assert answer.stdout == f"BROKEN after 0 good records: {expected}\n"


@pytest.mark.parametrize(
    ("written", "found"),
    [
        (chain(1) + b'{"seq": "\xff"}\n', "1 good records: {}:2: not a JSON record"),
        (chain(1) + b"[" * 100_000 + b"\n", "1 good records: {}:2: not a JSON record"),
        (chain("one", 2), "0 good records: {}:1: not an audit record (its seq is not a record number)"),
        # A lone surrogate, escaped: UTF-8 and JSON, but no UTF-8 to hash (a traceback)
        (
            chain(1) + rb'{"seq": 2, "prev": "", "hash": "", "a": "\ud800"}' + b"\n",
            "1 good records: {}:2: edited: its hash does not match its content",
        ),
    ],
    ids=["not-utf-8", "nested", "seq-not-a-number", "lone-surrogate"],
)
def test_a_line_that_is_no_record_is_named_in_one_line(tmp_path: Path, written: bytes, found: str) -> None:
    trail = tmp_path / "audit.jsonl"
    trail.write_bytes(written)
    answer = verified(str(trail))
    assert answer.returncode == 1, answer.stderr[-500:]
    assert "Traceback" not in answer.stderr
    assert answer.stdout == f"BROKEN after {found.format(trail)}\n"


def padded(length: int) -> bytes:
    """Record 1, of exactly ``length`` bytes (its ``pad`` filling it out), hashed right."""
    pad = ""
    while True:
        body = {"event": "call", "pad": pad, "prev": GENESIS, "seq": 1}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        line = json.dumps({**body, "hash": digest}).encode()
        if len(line) >= length:
            assert len(line) == length
            return line
        pad += "x" * (length - len(line))


@pytest.mark.parametrize("newline", [True, False], ids=["newline", "last-line"])
@pytest.mark.parametrize("past", [0, 1], ids=["1MiB", "1MiB+1"])
def test_a_record_of_one_mib_is_read_and_one_byte_more_is_not_with_or_without_its_newline(
    tmp_path: Path, past: int, newline: bool
) -> None:
    # The newline counted towards the bound: a 1 MiB record was refused as the first of two
    # lines, read as the last (with no newline after it).
    trail = tmp_path / "audit.jsonl"
    trail.write_bytes(padded(2**20 + past) + (b"\n" if newline else b""))
    answer = verified(str(trail))
    if past:
        assert answer.returncode == 1, answer.stdout
        assert "a line of more than 1 MiB, not a record" in answer.stdout + answer.stderr
    else:
        assert answer.returncode == 0, answer.stdout + answer.stderr
