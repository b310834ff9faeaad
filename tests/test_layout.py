"""The module boundaries the README's layout promises (issue 18): each holds, or fails here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agent_gateway
from agent_gateway.agent.tool import RUNNER_MODULE

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
