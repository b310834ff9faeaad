"""The Dockerfile and compose.yaml, checked without a container runtime (none on this machine):
what they copy exists, what they run is a command the gateway accepts, and they publish the
gateway on loopback behind a token."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from agent_gateway.cli import parse_arguments, serve_config
from agent_gateway.config_files import load_config
from tests.support import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")
TOKEN = {"AGENT_GATEWAY_TOKEN": "t" * 32}


def instructions(name: str) -> list[str]:
    joined = DOCKERFILE.replace("\\\n", " ")
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(f"{name} ")]


def compose_gateway() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))["services"]["gateway"]


def image_path(path: str) -> Path:
    """Where a file the image reads comes from in the repository (by the Dockerfile's COPYs)."""
    for copy in instructions("COPY"):
        *sources, target = copy.split()
        for source in sources:
            if target.rstrip("/") == path or (target.endswith("/") and f"{target}{source}" == path):
                return ROOT / source
    raise AssertionError(f"the image has no {path}")


def test_everything_the_dockerfile_copies_exists_and_it_installs_the_locked_versions() -> None:
    copies = [source for copy in instructions("COPY") for source in copy.split()[:-1]]
    assert copies
    for source in copies:
        assert (ROOT / source).exists(), source
    assert any("-c constraints.txt ." in run for run in instructions("RUN"))


def test_the_images_command_serves_its_config_and_the_config_is_accepted() -> None:
    entrypoint = json.loads(instructions("ENTRYPOINT")[0])
    command = json.loads(instructions("CMD")[-1])
    # tini as PID 1 reaps the orphans an upstream's processes leave; the gateway reaps only its own.
    assert entrypoint == ["tini", "--", "agent-gateway"]
    assert any("tini" in run.split() for run in instructions("RUN"))
    check_serve(command)
    assert compose_gateway()["command"] == command


def check_serve(argv: list[str]) -> None:
    args = parse_arguments(argv)
    config = serve_config(args, load_config(image_path(args.config), TOKEN))
    assert (config.server.host, config.server.port, config.auth.mode) == ("0.0.0.0", 8000, "bearer")
    assert str(config.auth.tokens[0].token) == TOKEN["AGENT_GATEWAY_TOKEN"]
    assert set(config.upstreams) == {"everything", "memory", "notes"}


def test_compose_publishes_the_gateway_on_the_hosts_loopback_only_and_requires_the_token() -> None:
    service = compose_gateway()
    assert service["ports"] == ["127.0.0.1:8000:8000"]
    assert re.fullmatch(r"\$\{AGENT_GATEWAY_TOKEN:\?.+\}", service["environment"]["AGENT_GATEWAY_TOKEN"])
    assert service["build"] == "."
    assert any(volume.endswith(":/data") for volume in service["volumes"])


# -- deploy/: several replicas -------------------------------------------------------------

DEPLOY = ROOT / "deploy"
REPLICA_ENV = {
    "AGENT_GATEWAY_TOKEN": "t" * 32,
    "GATEWAY_STATE_KEY": "k" * 64,
    "DATABASE_URL": "postgresql://gateway:gateway@postgres:5432/gateway",
}


def replica_compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))["services"]


def test_the_replicas_run_one_config_that_shares_state_through_redis_and_postgres() -> None:
    services = replica_compose()
    replicas = [services["gateway-1"], services["gateway-2"]]
    assert replicas[0] == replicas[1]
    (mount,) = replicas[0]["volumes"]
    source, target, _ = mount.split(":")
    assert (DEPLOY / source).resolve() == DEPLOY / "gateway.yaml"
    args = parse_arguments(replicas[0]["command"])
    assert args.config == target
    config = serve_config(args, load_config(DEPLOY / "gateway.yaml", REPLICA_ENV))
    assert config.store is not None
    assert config.store.url == "redis://redis:6379/0"
    assert config.agent.memory.store == "postgres"
    assert config.server.state_keys == (REPLICA_ENV["GATEWAY_STATE_KEY"],)
    assert (config.server.host, config.server.port) == ("0.0.0.0", 8000)
    assert config.auth.mode == "bearer"


def test_the_balancer_round_robins_over_both_replicas_with_the_tested_proxy_lines() -> None:
    balancer = replica_compose()["balancer"]
    assert balancer["ports"] == ["127.0.0.1:8000:8080"]
    mounts = dict(m.rsplit(":", 1)[0].split(":") for m in balancer["volumes"])
    assert mounts == {
        "./nginx.conf": "/etc/nginx/nginx.conf",
        "./mcp-proxy.conf": "/etc/nginx/mcp-proxy.conf",
    }
    conf = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    assert re.findall(r"server (gateway-\d):8000", conf) == ["gateway-1", "gateway-2"]
    assert "include /etc/nginx/mcp-proxy.conf;" in conf
    assert "listen 8080;" in conf
    directives = [line.split("#")[0] for line in conf.splitlines()]
    assert not [d for d in directives if re.search(r"\b(sticky|ip_hash|hash)\b", d)]
