"""The module boundaries the README's layout promises (issue 18): each holds, or fails here."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from types import FrameType

import pytest
from mcp import Client

import agent_gateway
from agent_gateway.agent.tool import RUNNER_MODULE
from tests.faults.harness import wait_until
from tests.support import running_gateway, serving_upstream
from tests.test_responses import upstream

SRC = Path(agent_gateway.__file__).resolve().parent


def imports_of(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def loaded_by(imports: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules under ``prefixes`` a fresh interpreter holds after ``import {imports}``."""
    code = f"import sys, {imports}; print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return ast.literal_eval(loaded.stdout.strip())


def test_the_catalog_is_pure_it_pulls_in_no_transport() -> None:
    assert loaded_by("agent_gateway.catalog", ("agent_gateway.upstreams", "aiohttp", "websockets")) == []


def test_the_catalog_pulls_in_no_store_and_no_server() -> None:
    # Its pins' key (catalog_parts.source_of) lived in pins.py, which brought the shared
    # store's and Postgres's clients, and through them FastMCP, into every catalog user.
    prefixes = ("agent_gateway.store", "agent_gateway.pins", "redis", "psycopg", "fastmcp")
    assert loaded_by("agent_gateway.catalog", prefixes) == []


def test_a_gateway_without_a_provider_loads_no_provider_sdk() -> None:
    # Each takes ~1 s and ~40 MB to import: a gateway whose model comes from the client
    # (the example's) must not pay for them at start-up (issue 15: start-up and RSS at scale).
    # The agent's runner is imported while the upstreams connect (runtime.importing): with it.
    sdks = ("anthropic", "openai", "langchain_anthropic", "langchain_openai")
    assert loaded_by(f"agent_gateway.cli, {RUNNER_MODULE}", sdks) == []


def test_the_gateway_loads_without_the_agents_libraries() -> None:
    # LangChain and LangGraph (~0.5 s of CPU) are imported by Gateway.running while the
    # upstreams connect (runtime.importing), not with the gateway's modules before they start.
    gateway = "agent_gateway.cli, agent_gateway.server, agent_gateway.pipeline"
    assert loaded_by(gateway, ("langchain_core", "langgraph", "langsmith")) == []


def test_a_gateway_without_a_store_or_postgres_loads_neither_client() -> None:
    # Redis's client (~0.13 s) and psycopg (~0.1 s) were imported by every start, with or without
    # `store:` and memory in Postgres: ~10 % of a start's imports, ~200 starts a test run.
    gateway = f"agent_gateway.cli, agent_gateway.server, {RUNNER_MODULE}"
    assert loaded_by(gateway, ("redis", "psycopg", "agent_gateway.store.state")) == []


def test_a_gateway_loads_aiohttp_only_for_an_http_upstream() -> None:
    # ~0.16 s of every start, also for a gateway whose upstreams are all stdio (the example's, an
    # IDE's): the wire of HTTP upstreams is imported when the first one is connected.
    assert loaded_by(f"agent_gateway.cli, agent_gateway.server, {RUNNER_MODULE}", ("aiohttp",)) == []


def test_the_agents_runner_is_where_the_gateway_imports_it_by_name() -> None:
    from agent_gateway.agent.runner import AgentRunner

    assert AgentRunner.__module__ == RUNNER_MODULE


def test_the_agent_reaches_clients_only_through_the_caller() -> None:
    found = {
        f"{path.name}: {module}"
        for path in (SRC / "agent").glob("*.py")
        for module in imports_of(path)
        if module.startswith(("agent_gateway.components", "agent_gateway.downstream.sessions"))
    }
    assert found == set()


def test_the_proxy_only_routes_the_client_side_is_downstreams() -> None:
    tree = ast.parse((SRC / "proxy.py").read_text())
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert classes == {"Proxy"}


def test_every_error_a_client_receives_is_made_by_to_wire() -> None:
    # Issue 18, item 6: one boundary to the wire. MCPError is built in errors.to_wire only,
    # but on the upstream side (upstreams/, and the SDK's seam in compat/), where the
    # forwarder speaks the SDK client's errors before translation.py takes them in.
    inward = ("upstreams/", "compat/")
    made = []
    for path in SRC.rglob("*.py"):
        where = path.relative_to(SRC).as_posix()
        if where == "errors.py" or where.startswith(inward):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "MCPError"
            ):
                made.append(f"{where}:{node.lineno}")
    assert made == []


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_path_of_a_call() -> list[list[str]]:
    """The modules each numbered step of the README's path of one ``tools/call`` names, as
    files under ``src/agent_gateway`` (``http.DirectRoute`` -> ``http.py``)."""
    text = README.read_text()
    start = text.index("**The path of one `tools/call`**")
    section = text[start : text.index("`prompts/get`, `resources/read`", start)]
    steps = []
    for line in section.splitlines():
        if not re.match(r"\d+\. ", line):
            continue
        named = []
        for token in re.findall(r"`([\w/.]+)`", line):
            stem = token.removesuffix(".py") if token.endswith(".py") else token.split(".")[0]
            if (SRC / f"{stem}.py").is_file() and f"{stem}.py" not in named:
                named.append(f"{stem}.py")
        steps.append(named)
    return steps


async def entered_by_one_call(mode: str) -> list[str]:
    """The modules of ``src/agent_gateway`` one ``tools/call`` over HTTP enters, in the order it
    first enters them (a warm call first: the handshake, the upstream's session): those every
    one of three calls entered, so that a timer of the gateway's own (a sweep, a batch of
    records) firing during one call on a loaded machine is not taken for the call's path."""
    root = f"{SRC}/"
    traces: list[dict[str, None]] = []

    def seen(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            traces[-1].setdefault(frame.f_code.co_filename.removeprefix(root), None)

    async with (
        serving_upstream(upstream()) as url,
        # No health pings: one landing in the traced window would enter modules of its own.
        running_gateway({"upstreams": {"up": {"url": url, "health": {"interval": None}}}}) as gw,
        Client(gw.url, mode=mode) as client,  # type: ignore[arg-type]
    ):
        audit = gw.gateway.audit
        assert audit is not None
        await client.call_tool("up__echo", {"text": "warm"})
        for n in range(3):
            # The call before written to the trail first: on a loaded machine its batch was
            # written during each traced call (audit_outage.py taken for the call's path).
            await wait_until(lambda n=n: audit.path.read_bytes().count(b"\n") >= n + 1)
            traces.append({})
            sys.setprofile(seen)
            try:
                await client.call_tool("up__echo", {"text": "traced"})
            finally:
                sys.setprofile(None)
    return [module for module in traces[0] if all(module in trace for trace in traces)]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_readmes_path_of_a_tools_call_is_the_path_a_call_takes(mode: str) -> None:
    steps = readme_path_of_a_call()
    entered = await entered_by_one_call(mode)
    named = {module for step in steps for module in step}
    assert [module for module in entered if module not in named] == []  # none left out
    # Each step begins where the one before it hands the call on (the last step is the way out).
    first = {module: entered.index(module) for module in entered}
    leading = [step[0] for step in steps[:-1]]
    assert [first[module] for module in leading] == sorted(first[module] for module in leading), leading
