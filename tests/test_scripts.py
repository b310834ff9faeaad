"""The repository's scripts, run as a newcomer runs them."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess

from packaging.requirements import Requirement

from tests.support import ROOT


def test_setup_says_what_it_does_one_line_per_step() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "setup"), "--no-npm"], capture_output=True, text=True, check=True, timeout=600
    )
    lines = done.stdout.splitlines()
    assert lines
    assert all(line.startswith("setup: ") for line in lines), lines


def locked() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {canonical(name): version for name, version in pins}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_dependency_is_pinned_and_installed_at_its_pinned_version() -> None:
    pins = locked()
    wanted = [Requirement(r) for r in importlib.metadata.requires("agent-gateway") or []]
    for requirement in wanted:
        if requirement.marker is None or requirement.marker.evaluate({"extra": "dev"}):
            assert canonical(requirement.name) in pins, (
                f"{requirement.name} is not in constraints.txt: run scripts/lock"
            )
    installed = {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    drifted = {
        name: (version, installed[name])
        for name, version in pins.items()
        if installed.get(name, version) != version
    }
    assert drifted == {}, "installed versions differ from constraints.txt (run scripts/setup)"


def test_the_license_is_the_apache_2_0_text_pyproject_names() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert importlib.metadata.metadata("agent-gateway")["License"] == "Apache-2.0"
