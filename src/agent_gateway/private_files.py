"""Files the gateway keeps that hold its clients' words or actions (conversations, pins,
the audit trail): created for this user only."""

from __future__ import annotations

import os
from pathlib import Path


def private(path: Path) -> None:
    """Create ``path``'s directory (0700) and the file itself (0600) when missing, and make an
    existing file 0600."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
