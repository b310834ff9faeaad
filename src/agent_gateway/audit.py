"""The audit trail: one append-only JSONL record per ``tools/call``, ``prompts/get``,
``resources/read`` and ``ask_agent`` run (who, when, what, where, how it ended, how long, the
trace id, a digest of the arguments), hash-chained so that an edited, inserted or deleted
record is found by ``agent-gateway audit verify``.

Each record carries ``seq`` (its number in the chain), ``prev`` (the previous record's
``hash``) and ``hash`` (SHA-256 of the record's canonical JSON without ``hash``). The chain
continues across restarts (the last record is read at start) and across rotation (the file
is renamed ``.1``, ``.1`` to ``.2`` …, and a new file continues the chain).

Records come from ``Activity`` (one per finished call, the same one the access log line is
made from) into a bounded queue; a writer task writes them in batches off the event loop. A
full queue drops records rather than slow calls, counted in a metric and a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from opentelemetry import metrics

from agent_gateway.activity import Call
from agent_gateway.audit_claim import claim, unlittered
from agent_gateway.audit_outage import Outage
from agent_gateway.audit_verify import GENESIS, canonical_json
from agent_gateway.config import AuditConfig
from agent_gateway.errors import CannotServe
from agent_gateway.logs import one_line
from agent_gateway.private_files import private
from agent_gateway.runtime import CLEANUP_TIMEOUT

logger = logging.getLogger(__name__)

_BATCH = 512
QUEUED_BYTES = 64 << 20
"""Bytes of arguments (``audit.arguments: full``) queued for the writer at most; past that a
record is dropped, counted, as at the queue's length."""
_GATHER = 0.05
"""Seconds a batch waits for more records after its first: one hop to the writer thread per
batch, not per call (a record is on disk within ``_GATHER`` of its call ending, plus the write)."""

_meter = metrics.get_meter("agent-gateway")
audit_records = _meter.create_counter(
    "agent_gateway.audit.records",
    description="Audit records by state: written, or dropped (the writer fell behind).",
)


def chained(record: dict[str, Any], seq: int, prev: str) -> tuple[str, str]:
    """``record``'s line in the chain (its canonical JSON with ``seq``, ``prev`` and its own
    ``hash`` added), and that hash: serialised once, the hash appended to the text hashed."""
    canonical = canonical_json(record | {"seq": seq, "prev": prev})
    try:
        data = canonical.encode()
    except UnicodeEncodeError:  # a lone surrogate admission missed: a '?' for it, not the writer's end
        canonical = canonical.encode(errors="replace").decode()
        data = canonical.encode()
    digest = hashlib.sha256(data).hexdigest()
    # Hashed as canonical (so every trail written before verifies as it did), written with
    # U+2028, C1 and bidirectional controls escaped: one record a line to every reader.
    return f'{one_line(canonical[:-1])},"hash":"{digest}"}}\n', digest


def record_of(call: Call) -> dict[str, Any]:
    record: dict[str, Any] = {
        "time": call.at,
        "client": call.client,
        "session": call.session,
        "method": call.method,
        "name": call.name,
        "upstream": call.upstream,
        "outcome": call.outcome,
        "detail": call.detail,
        "duration_ms": call.duration_ms,
        "trace_id": call.trace_id,
        "arguments_sha256": call.arguments_digest,
    }
    if call.run is not None:  # an ask_agent run's call for the client
        record["run"] = call.run
    if call.arguments is not None:
        record["arguments"] = call.arguments
    return record


class AuditLog:
    """The writer: ``record`` (an ``Activity`` subscriber) queues, ``run`` writes."""

    def __init__(self, config: AuditConfig) -> None:
        self.config = config
        self.path = Path(config.path)
        self.dropped = 0
        self._send: MemoryObjectSendStream[Call] | None = None
        self._seq, self._prev = 0, GENESIS
        self._file: BinaryIO | None = None
        self._lock: BinaryIO | None = None
        self._writing = threading.Lock()
        """Held by the thread writing: one given up on (cancelled) may still be at it."""
        self._queued_bytes = 0
        self._size = 0
        """Bytes in the file up to its last whole record."""
        self.outage = Outage(self.path)

    def record(self, call: Call) -> None:
        """Queue ``call``; never blocks (a full queue drops it, counted)."""
        if self._send is None:
            return  # not running (a command that does not serve)
        try:
            if self._queued_bytes + call.arguments_bytes > QUEUED_BYTES:
                raise anyio.WouldBlock
            self._send.send_nowait(call)
            self._queued_bytes += call.arguments_bytes
        except anyio.WouldBlock:
            self.dropped += 1
            audit_records.add(1, {"state": "dropped"})
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                why = self.outage.problem or "the writer is behind"
                logger.warning("audit: %d records dropped so far: %s", self.dropped, why)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # shutting down: calls finishing now are not audited

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """``run`` in a task of its own while the block runs."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.run)
            yield
            tg.cancel_scope.cancel()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write queued records until cancelled; then write what is queued (bounded, shielded).

        Raises:
            CannotServe: the trail cannot be opened (its directory cannot be made, say).
        """
        try:
            await anyio.to_thread.run_sync(self._open)
        except OSError as exc:  # ended the start-up with a traceback of ten exception groups
            raise CannotServe(f"audit.path: cannot open {self.path}: {exc.strerror or exc}") from None
        self._send, receive = anyio.create_memory_object_stream[Call](self.config.queue)
        task_status.started()
        pending: list[Call] = []  # taken from the queue, not yet written: written on the way out
        try:
            while True:
                if not pending:
                    try:
                        pending.append(await receive.receive())
                    except anyio.EndOfStream:
                        break
                    await anyio.sleep(_GATHER)
                if self.outage.problem is None:  # while failing, the rest wait in the queue, bounded
                    pending += _drain(receive, _BATCH - len(pending))
                before = sum(call.arguments_bytes for call in pending)
                try:
                    await _in_daemon_thread(self._write, pending)
                except OSError as exc:  # a full disk ended the gateway, a torn line left in the trail
                    await anyio.sleep(self.outage.failed(exc, self.dropped))
                else:
                    self.outage.resumed(self.dropped)
                finally:
                    self._queued_bytes -= before - sum(call.arguments_bytes for call in pending)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT) as bound:
                self._send.close()
                # The same list: a write given up on (cancelled) takes what it wrote from it.
                pending += _drain(receive, self.config.queue)
                receive.close()
                await _in_daemon_thread(self._close, pending)
            if bound.cancelled_caught:
                logger.error(
                    "audit: %s did not take the last records in %ss: given up", self.path, CLEANUP_TIMEOUT
                )

    def _open(self) -> None:
        self._claim()
        self.outage.path = self.path
        private(self.path)
        _ended(self.path)
        last = _last_record(self.path) or _last_record(_rotated(self.path, 1))
        if last is not None:
            self._seq, self._prev = int(last["seq"]), str(last["hash"])
        logger.info("audit: appending to %s (record %d on)", self.path, self._seq + 1)

    def _write(self, calls: list[Call]) -> None:
        """Append ``calls``' records (a gap record first if records were lost since the last
        one said), taking each from ``calls`` once it is in the file. A write that fails is cut
        back to the file's last whole record, the chain where it was: the rest is tried again."""
        with self._writing:
            gap = self.outage.gap(self.dropped, self._seq)
            records = ([gap] if gap else []) + [record_of(call) for call in calls]
            chunk, seq, prev, done = bytearray(), self._seq, self._prev, 0
            try:
                for n, record in enumerate(records, 1):
                    seq += 1
                    line, prev = chained(record, seq, prev)
                    chunk += line.encode()
                    # rotated at the record that reaches max_bytes, not after a batch
                    if n == len(records) or self._size + len(chunk) >= self.config.max_bytes:
                        self._append(chunk)
                        chunk.clear()
                        self._seq, self._prev = seq, prev
                        if gap is not None:
                            self.outage.told(gap)
                        done, gap = n - (len(records) - len(calls)), None
                        if self._size >= self.config.max_bytes:
                            self._rotate()
            finally:
                del calls[:done]
                audit_records.add(done, {"state": "written"})

    def _append(self, data: bytes | bytearray) -> None:
        """``data`` at the end of the file, whole, or the file cut back to where it ended."""
        if self._file is None:  # kept open between batches: one open per file
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115  # closed by _close or _rotate
            self._size = self._file.seek(0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view) or 0 :]
        except OSError:
            with contextlib.suppress(OSError):  # a line torn here broke the chain for verify
                os.ftruncate(self._file.fileno(), self._size)
            raise
        self._size += len(data)

    def _close(self, rest: list[Call]) -> None:
        try:
            if rest:
                self._write(rest)
        except OSError as exc:
            self.dropped += len(rest)
            audit_records.add(len(rest), {"state": "dropped"})
            logger.error("audit: %d records not written on the way out: %s", len(rest), exc.strerror or exc)
        with self._writing:
            unlittered(self.path, Path(self.config.path))  # while its lock is held (audit_claim)
            self._closed()

    def _closed(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock is not None:
            self._lock.close()  # the lock goes with it
            self._lock = None

    def _claim(self) -> None:
        self.path, self._lock = claim(self.path)

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for n in range(self.config.keep, 0, -1):
            older = _rotated(self.path, n)
            if older.exists():
                if n == self.config.keep:
                    older.unlink()
                else:
                    older.rename(_rotated(self.path, n + 1))
        self.path.rename(_rotated(self.path, 1))
        private(self.path)
        logger.info("audit: rotated %s at record %d", self.path, self._seq)


async def _in_daemon_thread(write: Callable[[list[Call]], None], calls: list[Call]) -> None:
    """``write(calls)`` in a daemon thread of its own, given up on when cancelled. On a hung
    disk (an NFS mount gone) a write never returns: in anyio's worker (not a daemon) it held
    the gateway's stop for ever, past every bound; given up on, it ends with the process
    (``AuditLog._writing`` keeps it apart from a later write meanwhile)."""
    done = anyio.Event()
    token = anyio.lowlevel.current_token()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            write(calls)
        except BaseException as exc:  # handed to the task, which raises it
            failed.append(exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=run, name="audit writer", daemon=True).start()
    await done.wait()
    if failed:
        raise failed[0]


def _drain(receive: MemoryObjectReceiveStream[Call], limit: int) -> Iterator[Call]:
    for _ in range(limit):
        try:
            yield receive.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return


def _rotated(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}.{n}")


def _last_record(path: Path) -> dict[str, Any] | None:
    """The last whole record in the trail at ``path``, or None. Lines after it that are not
    records (the process or the disk stopped mid-write) are skipped with a warning: one such
    line ended every start of the gateway with a traceback. ``audit verify`` still names it."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as file:
        file.seek(max(0, path.stat().st_size - (1 << 20)))
        tail = [line for line in file.read().splitlines() if line.strip()]
    for skipped, line in enumerate(reversed(tail)):
        if (record := _record(line)) is not None:
            if skipped:
                logger.warning(
                    "audit: %s ends in %d line(s) that are not whole records; the chain goes on from record %d",
                    path,
                    skipped,
                    record["seq"],
                )
            return record
    if tail:
        logger.warning("audit: %s holds no whole record in its last MiB; the chain starts again", path)
    return None


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if (
        isinstance(record, dict)
        and isinstance(record.get("seq"), int)
        and isinstance(record.get("hash"), str)
    ):  # pyright: ignore[reportUnknownMemberType]
        return record  # pyright: ignore[reportUnknownVariableType]
    return None


def _ended(path: Path) -> None:
    """End ``path`` with a line break if a torn record left it without one, so the next
    record starts a line of its own rather than being glued to it."""
    if not path.is_file() or path.stat().st_size == 0:  # a FIFO standing for a hung mount, say
        return
    with open(path, "rb+") as file:
        file.seek(-1, os.SEEK_END)
        if file.read(1) != b"\n":
            file.write(b"\n")
