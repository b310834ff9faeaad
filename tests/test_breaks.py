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


UNBROKEN = {
    "src/agent_gateway/agent/request.py",  # a dataclass of what one ask_agent call asks
    "src/agent_gateway/compat/httpx2.py",  # one re-export
    "src/agent_gateway/compat/stdlib.py",  # log records without the caller lookup: speed only
    "src/agent_gateway/compat/streams.py",  # what every stream wrapper repeats
    "src/agent_gateway/config_base.py",  # the configuration's shared base class and types
}
"""Modules no patch breaks, each for its reason: they hold no behaviour a test could miss."""


def test_every_module_with_behaviour_of_its_own_is_broken_by_some_patch() -> None:
    # A module no patch breaks has tests nobody has seen fail: writing breaks for the 30
    # modules with none (and 19 with few) found 13 tests that passed with their feature
    # broken, and behaviours no test checked at all. A new module comes with its break (or
    # a reason here).
    broken = {name for patch in BREAKS.glob("*.patch") for name in touched(patch)}
    modules = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "src" / "agent_gateway").rglob("*.py")
        if path.name != "__init__.py" or len(path.read_text(encoding="utf-8").splitlines()) > 40
    }
    unbroken = sorted(modules - broken - UNBROKEN)
    assert not unbroken, f"write a break patch for each (README: Tests that can fail): {unbroken}"
    assert not UNBROKEN & broken, f"broken now, out of UNBROKEN with them: {sorted(UNBROKEN & broken)}"
