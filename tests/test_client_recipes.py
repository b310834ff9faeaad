"""The README's "Connect a client" entries: each is a valid entry for its client and starts the
gateway the way the command line accepts, at the address the shipped gateway.yaml serves."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

from agent_gateway.cli import parse_arguments, serve_config
from agent_gateway.config_files import load_config, parse_config
from tests.support import ROOT

CHECKOUT = "/path/to/agent-gateway"
EXECUTABLE = f"{CHECKOUT}/.venv/bin/agent-gateway"


def section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^## Connect a client\n(.*?)^## ", text, re.S | re.M)
    assert found is not None, "README.md has no 'Connect a client' section"
    return found.group(1)


def json_blocks() -> list[dict[str, Any]]:
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section(), re.S)]


def shell_lines() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", section(), re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def shipped_url() -> str:
    server = load_config(ROOT / "gateway.yaml", {}).server
    return f"http://{server.host}:{server.port}{server.path}"


def check_launch(command: str, args: list[str]) -> None:
    """``command args`` starts the gateway over stdio on the checkout's gateway.yaml."""
    assert command == EXECUTABLE
    parsed = parse_arguments(args)
    assert parsed.config == f"{CHECKOUT}/gateway.yaml"
    parsed.config = str(ROOT / "gateway.yaml")
    config = serve_config(parsed, load_config(parsed.config, {}))
    assert config.server.transport == "stdio"


def test_the_section_names_every_client_it_promises() -> None:
    text = section()
    for client in (
        "Claude Desktop",
        "Cursor",
        "VS Code",
        "Claude Code",
        "Inspector",
        "pipx install",
        "sampling",
    ):
        assert client in text, client


def test_every_json_entry_is_a_stdio_launch_or_the_shipped_http_address() -> None:
    entries = [entry for block in json_blocks() for layout in block.values() for entry in layout.values()]
    assert len(entries) == 5
    for entry in entries:
        if "url" in entry:
            assert entry["url"] == shipped_url()
            assert entry.get("type", "http") == "http"
        else:
            assert entry.get("type", "stdio") == "stdio"
            check_launch(entry["command"], entry["args"])


@pytest.mark.parametrize("index", range(3))
def test_each_json_block_is_in_a_layout_mcp_servers_files_use(index: int) -> None:
    block = json_blocks()[index]
    assert list(block) in (["mcpServers"], ["servers"])
    parse_config(block, {}, source="README")  # the gateway reads the same layouts as its own config


def test_every_shell_line_launches_the_gateway_or_reaches_its_http_address() -> None:
    lines = shell_lines()
    assert len(lines) == 4
    for words in lines:
        if "--" in words:  # claude mcp add NAME -- COMMAND ARGS
            launch = words[words.index("--") + 1 :]
            check_launch(launch[0], launch[1:])
        elif words[:2] == ["npx", "@modelcontextprotocol/inspector"] and "--cli" not in words:
            check_launch(words[2], words[3:])
        else:
            assert shipped_url() in words
