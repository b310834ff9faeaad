"""The deliberately broken builds of ``tests/breaks`` (run by ``scripts/break``) stay what they
claim: each patch still applies to ``src/``, and what it writes names only what its module
defines (a patch reading an unimported name made its test fail on a ``NameError``, not on the
break it claims)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BREAKS = ROOT / "tests" / "breaks"


def touched(patch: Path) -> list[str]:
    lines = patch.read_text(encoding="utf-8").splitlines()
    return [line.removeprefix("+++ b/") for line in lines if line.startswith("+++ b/")]


def test_every_break_applies_and_names_only_what_its_module_defines(tmp_path: Path) -> None:
    unapplied = []
    for patch in sorted(BREAKS.glob("*.patch")):
        where = tmp_path / patch.stem
        for name in touched(patch):
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, where / name)
        applied = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(patch)], cwd=where, capture_output=True, text=True
        )
        if applied.returncode != 0:
            unapplied.append(f"{patch.name}: {applied.stderr.strip()[:200]}")
    assert not unapplied, "regenerate these patches against src/:\n" + "\n".join(unapplied)
    lint = [
        sys.executable,
        "-m",
        "ruff",
        "check",
        "--select",
        "F821,F823",
        "--no-cache",
        "--output-format",
        "concise",
    ]
    undefined = subprocess.run([*lint, str(tmp_path)], capture_output=True, text=True)
    assert undefined.returncode == 0, undefined.stdout
