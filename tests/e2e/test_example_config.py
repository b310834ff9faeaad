"""The repository's own gateway.yaml, run as shipped: npx reference servers and the notes server."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import mcp_types as types
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.session import ClientRequestContext

from agent_gateway.config_files import load_config
from agent_gateway.http import build_app
from agent_gateway.server import Gateway
from tests.e2e.peers import MODES, connected, hold, text_of
from tests.support import ROOT, serving

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@dataclass(frozen=True)
class Example:
    gateway: Gateway
    url: str
    memory_file: Path


@asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[str]:
    """``gateway`` running and served over HTTP on loopback; yields its MCP endpoint."""
    async with gateway.running(), serving(build_app(gateway)) as base:
        yield f"{base}{gateway.config.server.path}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def example(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Example]:
    """The shipped gateway.yaml, byte for byte, in a directory of its own, served from this
    process (whose working directory and PATH are not that directory's, nor the venv's)."""
    home = tmp_path_factory.mktemp("example")
    shutil.copy(ROOT / "gateway.yaml", home / "gateway.yaml")
    gateway = Gateway(load_config(home / "gateway.yaml", {}))
    url, stop = await hold(served(gateway))
    try:
        yield Example(gateway, url, home / ".agent-gateway" / "memory.jsonl")
    finally:
        await stop()


async def test_the_example_config_loads_with_its_defaults() -> None:
    config = load_config(ROOT / "gateway.yaml", {})
    assert (config.server.transport, config.server.host, config.server.port) == ("http", "127.0.0.1", 8000)
    assert list(config.upstreams) == ["everything", "memory", "notes"]


async def test_the_example_configs_paths_and_python_mean_the_same_from_any_directory() -> None:
    config = load_config(ROOT / "gateway.yaml", {})
    memory, notes = config.upstreams["memory"], config.upstreams["notes"]
    assert memory.env == {"MEMORY_FILE_PATH": str(ROOT / ".agent-gateway" / "memory.jsonl")}
    assert (memory.cwd, notes.cwd) == (str(ROOT), str(ROOT))
    assert notes.command == sys.executable
    assert config.agent.memory.path == str(ROOT / ".agent-gateway" / "conversations.sqlite")


async def test_every_upstream_of_the_example_config_comes_up(example: Example) -> None:
    statuses = {s.name: (str(s.state), s.last_error) for s in example.gateway.pool.statuses()}
    assert statuses == {"everything": ("up", None), "memory": ("up", None), "notes": ("up", None)}


async def test_the_catalog_holds_tools_of_all_three_upstreams_with_rename_and_exclude_applied(
    example: Example,
) -> None:
    tools = example.gateway.catalog.snapshot.tools
    assert {origin.upstream for origin in tools.values()} == {"everything", "memory", "notes"}
    assert {"everything__get-sum", "memory__read_graph", "notes__list_notes"} <= set(tools)
    assert (tools["notes__add"].upstream, tools["notes__add"].name) == ("notes", "add_note")
    assert "notes__add_note" not in tools
    assert "notes__word_count" not in tools


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_sees_the_renamed_tool_and_not_the_excluded_one(example: Example, mode: str) -> None:
    async with connected(example.url, mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
    assert "notes__add" in names
    assert not {"notes__add_note", "notes__word_count"} & names
    assert "notes__summarize_notes" in prompts


@pytest.mark.parametrize("mode", MODES)
async def test_the_renamed_tool_is_called_under_its_public_name(example: Example, mode: str) -> None:
    text = f"remember the {mode} era"
    async with connected(example.url, mode) as client:
        added = await client.call_tool("notes__add", {"text": text})
        listed = await client.call_tool("notes__list_notes", {})
        excluded = await client.call_tool("notes__word_count", {"text": "one two"})
    assert not added.is_error, text_of(added)
    assert added.structured_content is not None
    assert isinstance(added.structured_content["number"], int)
    assert text in json.dumps(listed.structured_content)
    assert excluded.is_error
    assert "notes__word_count" in text_of(excluded)


@pytest.mark.parametrize("mode", MODES)
async def test_memory_written_through_the_shipped_config_lands_next_to_it_and_reads_back(
    example: Example, mode: str
) -> None:
    entity = {"name": f"example-{mode}", "entityType": "test", "observations": ["from gateway.yaml"]}
    async with connected(example.url, mode) as client:
        created = await client.call_tool("memory__create_entities", {"entities": [entity]})
        opened = await client.call_tool("memory__open_nodes", {"names": [entity["name"]]})
    assert not created.is_error, text_of(created)
    assert not opened.is_error, text_of(opened)
    assert "from gateway.yaml" in text_of(opened)
    lines = example.memory_file.read_text(encoding="utf-8").splitlines()
    assert {"type": "entity", **entity} in [json.loads(line) for line in lines]


@pytest.mark.parametrize("mode", MODES)
async def test_server_everything_from_npx_answers_through_the_example_gateway(
    example: Example, mode: str
) -> None:
    async with connected(example.url, mode) as client:
        result = await client.call_tool("everything__get-sum", {"a": 1, "b": 1})
    assert text_of(result) == "The sum of 1 and 1 is 2."


async def test_ask_agent_on_the_example_config_uses_the_clients_model_across_two_upstreams(
    example: Example,
) -> None:
    """As shipped there is no model configured: the client's own lends itself through sampling."""
    seen: list[types.CreateMessageRequestParams] = []

    async def model(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> SampleReply:
        seen.append(params)
        last = params.messages[-1].content_as_list[0]
        if len(seen) == 1:
            return _uses("everything__get-sum", {"a": 19, "b": 23})
        if len(seen) == 2:
            assert isinstance(last, types.ToolResultContent)
            return _uses("notes__add", {"text": text_of(types.CallToolResult(content=last.content))})
        return types.CreateMessageResultWithTools(
            role="assistant", content=[types.TextContent(type="text", text="Noted: 42.")], model="ide-model"
        )

    tools = types.SamplingCapability(tools=types.SamplingToolsCapability())
    async with Client(
        example.url, mode="legacy", sampling_callback=model, sampling_capabilities=tools
    ) as client:
        result = await client.call_tool("ask_agent", {"query": "Add 19 and 23 and keep a note of it."})
        notes = await client.call_tool("notes__list_notes", {})
    assert not result.is_error, text_of(result)
    assert text_of(result) == "Noted: 42."
    assert result.structured_content is not None
    assert [c["name"] for c in result.structured_content["tool_calls"]] == [
        "everything__get-sum",
        "notes__add",
    ]
    assert result.structured_content["model"] == "ide-model"
    assert "The sum of 19 and 23 is 42." in json.dumps(notes.structured_content)
    assert seen[0].tools is not None
    assert {"everything__get-sum", "memory__read_graph", "notes__add"} <= {t.name for t in seen[0].tools}


SampleReply = types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData


def _uses(tool: str, arguments: dict[str, object]) -> types.CreateMessageResultWithTools:
    block = types.ToolUseContent(id=f"use-{tool}", name=tool, input=arguments)
    return types.CreateMessageResultWithTools(
        role="assistant", content=[block], model="ide-model", stop_reason="toolUse"
    )
