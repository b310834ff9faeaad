"""Run tests against deliberately broken builds: each ``tests/breaks/*.patch`` breaks one
feature in a copy of ``src/`` and names the tests that must fail on it.

``scripts/break NAME…`` (or ``--all``) copies ``src/`` to a temporary directory, applies the
patch there (the worktree is never touched), runs the patch's tests with ``PYTHONPATH``
pointing at the broken copy (subprocesses such as ``agent-gateway`` inherit it), and reports
each test that still passes: a test that passes with its feature broken proves nothing.
Exit status 0 when every named test failed on its break, 1 when one passed, 2 when a patch
no longer applies or names no test.

A patch is a unified diff against the repository root, preceded by header lines::

    Break: what the change breaks, in one line
    Test: tests/test_x.py::test_name[param]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BREAKS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Break:
    name: str
    path: Path
    what: str
    tests: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Break:
        what, tests = "", []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(("--- ", "diff ")):
                break
            key, _, value = line.partition(":")
            if key == "Break":
                what = value.strip()
            elif key == "Test":
                tests.append(value.strip())
        return cls(path.stem, path, what, tuple(tests))


@dataclass(frozen=True)
class Outcome:
    test: str
    failed: bool
    message: str


def available() -> dict[str, Break]:
    return {p.stem: Break.read(p) for p in sorted(BREAKS.glob("*.patch"))}


def broken_copy(brk: Break, into: Path) -> str | None:
    """Copy ``src/`` into ``into`` and apply the patch there; an error message if it fails."""
    shutil.copytree(ROOT / "src", into / "src", ignore=shutil.ignore_patterns("__pycache__"))
    applied = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", str(brk.path)], cwd=into, capture_output=True, text=True
    )
    if applied.returncode != 0:
        return f"the patch no longer applies to src/ (regenerate it): {applied.stderr.strip()}"
    env = {**os.environ, "PYTHONPATH": str(into / "src")}
    probe = [sys.executable, "-c", "import agent_gateway; print(agent_gateway.__file__)"]
    found = subprocess.run(probe, env=env, capture_output=True, text=True).stdout.strip()
    if not found.startswith(str(into)):
        return f"the broken copy is not the one imported ({found})"
    return None


def run_tests(brk: Break, into: Path) -> list[Outcome]:
    report = into / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(into / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    ran = subprocess.run([*command, *brk.tests], cwd=ROOT, env=env, capture_output=True, text=True)
    if not report.exists():
        print(ran.stdout[-2000:], ran.stderr[-2000:])
        return []
    outcomes = []
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            outcomes.append(Outcome(name, False, "skipped"))
        else:
            message = "" if bad is None else (bad.get("message") or "").splitlines()[0][:200]
            outcomes.append(Outcome(name, bad is not None, message))
    return outcomes


def check(brk: Break) -> int:
    print(f"== {brk.name}: {brk.what}", flush=True)
    if not brk.tests:
        print("   names no test (add 'Test:' lines)")
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"break-{brk.name}-") as tmp:
        if (problem := broken_copy(brk, Path(tmp))) is not None:
            print(f"   {problem}")
            return 2
        outcomes = run_tests(brk, Path(tmp))
    if not outcomes:
        print("   no test ran (are the 'Test:' ids right?)")
        return 2
    for outcome in outcomes:
        verdict = "fails, as it must" if outcome.failed else "PASSES with its feature broken"
        print(f"   {outcome.test}: {verdict}")
        if outcome.message:
            print(f"      {outcome.message}")
    print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
    return 0 if all(o.failed for o in outcomes) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/break", description="Run tests against a deliberately broken copy of src/."
    )
    parser.add_argument("names", nargs="*", help="patch names (tests/breaks/NAME.patch)")
    parser.add_argument("--all", action="store_true", help="every patch")
    parser.add_argument("--list", action="store_true", help="list the patches and what they break")
    args = parser.parse_args()
    known = available()
    if args.list:
        for brk in known.values():
            print(f"{brk.name}: {brk.what}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown or not (args.names or args.all):
        parser.error(
            f"name patches ({', '.join(known)}) or give --all" + (f"; unknown: {unknown}" if unknown else "")
        )
    chosen = list(known.values()) if args.all else [known[n] for n in args.names]
    return max(check(brk) for brk in chosen)


if __name__ == "__main__":
    sys.exit(main())
