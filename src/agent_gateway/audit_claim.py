"""One process per audit file: a lock beside the trail, held while the process writes it.

A second gateway on the same file, as two IDEs each launching one on the same config, would
fork its chain, and verify would call it tampered with: that one writes a file of its own
beside it instead (``audit.<pid>-1.jsonl``), and says so. A side file that took no record is
removed with its lock when its writer ends (each ``check``, or stdio gateway an IDE starts
beside a serving one, left an empty pair behind, named by its process id, never used again),
before its lock is let go: a process claiming the name meanwhile would hold a lock on a file
removed under it, and a third one take the name again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import BinaryIO

from agent_gateway.private_files import private

logger = logging.getLogger(__name__)

_CLAIMS = 100
"""Files a trail may be written to, itself and the ones beside it for other processes."""


def claim(wanted: Path) -> tuple[Path, BinaryIO]:
    """The file this process writes (``wanted``, else one beside it) and its lock, held.

    Raises:
        OSError: every one tried is held by another process.
    """
    for attempt in range(_CLAIMS):
        path = (
            wanted.with_name(f"{wanted.stem}.{os.getpid()}-{attempt}{wanted.suffix}") if attempt else wanted
        )
        held = lock_of(path)
        private(held)  # its directory made, as the trail's is
        lock = open(held, "ab")  # noqa: SIM115 (held open until the writer closes)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        if not _same_file(lock, held):  # removed by the process that held it, as it ended
            lock.close()
            continue
        if attempt:  # as meant (two IDEs on one config): said, not warned of
            logger.info("audit: %s is written by another gateway process; this one writes %s", wanted, path)
        return path, lock
    raise OSError(f"audit: {wanted} and {_CLAIMS - 1} files beside it are held by other processes")


def unlittered(path: Path, wanted: Path) -> None:
    """``path``, a side file of ``wanted`` that took no record, removed with its lock (call
    while the lock is held)."""
    if path == wanted:
        return
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()
            lock_of(path).unlink()


def lock_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")  # not matched by audit.jsonl.*


def _same_file(opened: BinaryIO, path: Path) -> bool:
    """Whether ``path`` still names the file ``opened`` is."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(opened.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
