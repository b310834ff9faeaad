"""The repository's scripts, run as a newcomer runs them."""

from __future__ import annotations

import subprocess

from tests.support import ROOT


def test_setup_says_what_it_does_one_line_per_step() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "setup"), "--no-npm"], capture_output=True, text=True, check=True, timeout=600
    )
    lines = done.stdout.splitlines()
    assert lines
    assert all(line.startswith("setup: ") for line in lines), lines
