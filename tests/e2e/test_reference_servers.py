"""server-everything, server-memory and server-filesystem behind one gateway served over HTTP."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import mcp_types as types
import pytest
import pytest_asyncio
from mcp.shared.exceptions import MCPError

from tests.e2e.peers import MODES, connected, hold, text_of, tiny_image_base64
from tests.support import npm_server, running_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@dataclass(frozen=True)
class Federation:
    url: str
    files: Path
    """The directory server-filesystem may touch."""
    memory_file: Path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def federation(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Federation]:
    files = tmp_path_factory.mktemp("files")
    memory_file = tmp_path_factory.mktemp("memory") / "memory.jsonl"
    config = {
        "upstreams": {
            "everything": npm_server("server-everything", "stdio"),
            "memory": {**npm_server("server-memory"), "env": {"MEMORY_FILE_PATH": str(memory_file)}},
            "filesystem": npm_server("server-filesystem", str(files)),
        }
    }
    gateway, stop = await hold(running_gateway(config))
    try:
        assert gateway.gateway.pool.ready, gateway.gateway.pool.statuses()
        yield Federation(gateway.url, files, memory_file)
    finally:
        await stop()


@pytest.mark.parametrize("mode", MODES)
async def test_the_tools_of_all_three_servers_are_listed_under_their_upstream_prefix(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert {
        "everything__echo",
        "everything__get-sum",
        "memory__create_entities",
        "memory__read_graph",
    } <= names
    assert {"filesystem__read_text_file", "filesystem__write_file"} <= names
    # Every name is an upstream's, prefixed, but for the gateway's own agent.
    assert {name.split("__", 1)[0] for name in names - {"ask_agent"}} == {
        "everything",
        "memory",
        "filesystem",
    }


@pytest.mark.parametrize("mode", MODES)
async def test_get_sum_returns_the_sum_computed_by_server_everything(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        result = await client.call_tool("everything__get-sum", {"a": 19, "b": 23.5})
    assert not result.is_error
    assert text_of(result) == "The sum of 19 and 23.5 is 42.5."


@pytest.mark.parametrize("mode", MODES)
async def test_echo_returns_the_message_it_was_given(federation: Federation, mode: str) -> None:
    async with connected(federation.url, mode) as client:
        result = await client.call_tool("everything__echo", {"message": "héllo, wörld ✓"})
    assert text_of(result) == "Echo: héllo, wörld ✓"


@pytest.mark.parametrize("mode", MODES)
async def test_structured_content_and_its_output_schema_pass_through(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        result = await client.call_tool("everything__get-structured-content", {"location": "Chicago"})
    weather = {"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}
    assert result.structured_content == weather
    assert json.loads(text_of(result)) == weather
    schema = tools["everything__get-structured-content"].output_schema
    assert schema is not None
    assert set(schema["properties"]) == {"temperature", "conditions", "humidity"}


@pytest.mark.parametrize("mode", MODES)
async def test_the_tiny_image_passes_through_unchanged(federation: Federation, mode: str) -> None:
    async with connected(federation.url, mode) as client:
        result = await client.call_tool("everything__get-tiny-image", {})
    kinds = [type(block) for block in result.content]
    assert kinds == [types.TextContent, types.ImageContent, types.TextContent]
    image = result.content[1]
    assert isinstance(image, types.ImageContent)
    assert image.mime_type == "image/png"
    assert image.data == tiny_image_base64()
    assert base64.b64decode(image.data).startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("mode", MODES)
async def test_entities_created_in_memory_are_read_back_from_the_graph(
    federation: Federation, mode: str
) -> None:
    name = f"gateway-{mode}-{uuid.uuid4().hex[:8]}"
    entity = {"name": name, "entityType": "test", "observations": [f"created over {mode}"]}
    async with connected(federation.url, mode) as client:
        created = await client.call_tool("memory__create_entities", {"entities": [entity]})
        graph = await client.call_tool("memory__read_graph", {})
    assert not created.is_error, text_of(created)
    assert created.structured_content is not None
    assert [e["name"] for e in created.structured_content["entities"]] == [name]
    assert graph.structured_content is not None
    stored = [e for e in graph.structured_content["entities"] if e["name"] == name]
    assert stored == [entity]
    lines = federation.memory_file.read_text(encoding="utf-8").splitlines()
    assert {"type": "entity", **entity} in [json.loads(line) for line in lines]


@pytest.mark.parametrize("mode", MODES)
async def test_a_file_written_through_the_filesystem_server_is_read_back(
    federation: Federation, mode: str
) -> None:
    path = federation.files / f"note-{mode}.txt"
    content = f"written over {mode}\nsecond line ✓\n"
    async with connected(federation.url, mode) as client:
        written = await client.call_tool("filesystem__write_file", {"path": str(path), "content": content})
        read = await client.call_tool("filesystem__read_text_file", {"path": str(path)})
    assert not written.is_error, text_of(written)
    assert path.read_text(encoding="utf-8") == content
    assert not read.is_error, text_of(read)
    assert text_of(read) == content


@pytest.mark.parametrize("mode", MODES)
async def test_a_read_outside_the_allowed_directory_is_an_error_result_from_the_filesystem_server(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        result = await client.call_tool("filesystem__read_text_file", {"path": "/etc/hostname"})
    assert result.is_error
    assert "denied" in text_of(result).lower()


@pytest.mark.parametrize("mode", MODES)
async def test_prompts_render_with_and_without_arguments(federation: Federation, mode: str) -> None:
    async with connected(federation.url, mode) as client:
        listed = {prompt.name: prompt for prompt in (await client.list_prompts()).prompts}
        simple = await client.get_prompt("everything__simple-prompt")
        with_args = await client.get_prompt("everything__args-prompt", {"city": "Lyon", "state": "Rhône"})
        required_only = await client.get_prompt("everything__args-prompt", {"city": "Oslo"})
    arguments = listed["everything__args-prompt"].arguments or []
    assert [(a.name, bool(a.required)) for a in arguments] == [("city", True), ("state", False)]
    assert [m.content for m in simple.messages] == [
        types.TextContent(type="text", text="This is a simple prompt without arguments.")
    ]
    assert [m.role for m in with_args.messages] == ["user"]
    assert with_args.messages[0].content == types.TextContent(
        type="text", text="What's weather in Lyon, Rhône?"
    )
    assert required_only.messages[0].content == types.TextContent(type="text", text="What's weather in Oslo?")


@pytest.mark.parametrize("mode", MODES)
async def test_a_listed_resource_reads_through_with_its_text_and_mime_type(
    federation: Federation, mode: str
) -> None:
    uri = "demo://resource/static/document/architecture.md"
    async with connected(federation.url, mode) as client:
        listed = {str(r.uri): r for r in (await client.list_resources()).resources}
        result = await client.read_resource(uri)
    assert listed[uri].mime_type == "text/markdown"
    [content] = result.contents
    assert isinstance(content, types.TextResourceContents)
    assert str(content.uri) == uri
    assert content.mime_type == "text/markdown"
    assert content.text.startswith("# Everything Server")


@pytest.mark.parametrize("mode", MODES)
async def test_resources_read_through_templates_keep_text_and_blob_contents(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        text = await client.read_resource("demo://resource/dynamic/text/7")
        blob = await client.read_resource("demo://resource/dynamic/blob/8")
    assert {
        "demo://resource/dynamic/text/{resourceId}",
        "demo://resource/dynamic/blob/{resourceId}",
    } <= templates
    [text_content] = text.contents
    assert isinstance(text_content, types.TextResourceContents)
    assert str(text_content.uri) == "demo://resource/dynamic/text/7"
    assert text_content.text.startswith("Resource 7: This is a plaintext resource")
    [blob_content] = blob.contents
    assert isinstance(blob_content, types.BlobResourceContents)
    assert base64.b64decode(blob_content.blob).decode().startswith("Resource 8: This is a base64 blob")


@pytest.mark.parametrize("mode", MODES)
async def test_invalid_arguments_are_rejected_by_the_gateway_naming_the_tool(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        result = await client.call_tool("everything__get-sum", {"a": "one", "b": 2})
        enum = await client.call_tool("everything__get-structured-content", {"location": "Paris"})
    assert result.is_error
    # The public name proves the gateway answered: the upstream only knows "get-sum".
    assert "Invalid arguments for tool 'everything__get-sum'" in text_of(result)
    assert "'one' is not of type 'number'" in text_of(result)
    assert enum.is_error
    assert "Invalid arguments for tool 'everything__get-structured-content'" in text_of(enum)


@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_tool_is_an_error_that_names_it(federation: Federation, mode: str) -> None:
    async with connected(federation.url, mode) as client:
        result = await client.call_tool("everything__no-such-tool", {})
    assert result.is_error
    assert "everything__no-such-tool" in text_of(result)


@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_prompt_or_resource_is_an_error_that_names_it(
    federation: Federation, mode: str
) -> None:
    async with connected(federation.url, mode) as client:
        with pytest.raises(MCPError, match="everything__no-such-prompt"):
            await client.get_prompt("everything__no-such-prompt")
        with pytest.raises(MCPError, match="demo://resource/nowhere"):
            await client.read_resource("demo://resource/nowhere")
