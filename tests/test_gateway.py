"""The federated catalog as a client sees it: names, pass-through, routing, bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx
import mcp_types as types
import pytest
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.types import Image
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import Field

from agent_gateway.errors import ConfigError
from tests.support import RunningGateway, gateway_process, running_gateway, serving_upstream

MODES = ["legacy", "auto"]
MODERN = "2026-07-28"
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
)


def alpha_server(calls: list[dict[str, Any]]) -> FastMCP:
    server = FastMCP("alpha", instructions="Alpha does echoes.")

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True, title="Echo"))
    def echo(text: str) -> str:
        """Echo the text back."""
        calls.append({"tool": "echo", "text": text})
        return text

    @server.tool
    def weather(city: str) -> dict[str, Any]:
        """Structured weather."""
        return {"city": city, "celsius": 21.5}

    @server.tool
    def picture() -> Image:
        """A tiny image."""
        return Image(data=TINY_PNG, format="png")

    @server.tool
    def broken() -> str:
        """Always fails."""
        raise ToolError("alpha exploded")

    @server.resource("shared://readme", mime_type="text/plain")
    def readme() -> str:
        return "alpha readme"

    @server.resource("alpha://only", mime_type="text/plain")
    def only() -> str:
        return "only alpha"

    @server.resource("alpha://items/{item}")
    def item(item: str) -> str:
        return f"alpha item {item}"

    @server.prompt
    def greet(name: Annotated[str, Field(title="Name to greet")]) -> str:
        """Greet someone."""
        return f"Hello, {name}!"

    return server


def beta_server() -> FastMCP:
    server = FastMCP("beta")

    @server.tool
    def echo(text: str) -> str:
        """Beta's echo, shouting."""
        return text.upper()

    @server.resource("shared://readme", mime_type="text/plain")
    def readme() -> str:
        return "beta readme"

    return server


@asynccontextmanager
async def two_upstreams(**alpha_extra: Any) -> AsyncIterator[tuple[RunningGateway, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        alpha = await stack.enter_async_context(serving_upstream(alpha_server(calls)))
        beta = await stack.enter_async_context(serving_upstream(beta_server()))
        config = {"upstreams": {"alpha": {"url": alpha, **alpha_extra}, "beta": {"url": beta}}}
        yield await stack.enter_async_context(running_gateway(config)), calls


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_sees_every_upstreams_tools_under_namespaced_names(mode: str) -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode=mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"alpha__echo", "alpha__weather", "alpha__picture", "beta__echo"} <= names
        assert (await client.call_tool("beta__echo", {"text": "hi"})).content[0] == types.TextContent(
            type="text", text="HI"
        )


@pytest.mark.parametrize("mode", MODES)
async def test_descriptions_schemas_and_annotations_pass_through_unchanged(mode: str) -> None:
    calls: list[dict[str, Any]] = []
    async with serving_upstream(alpha_server(calls)) as url:
        async with Client(url, mode=mode) as direct:
            original = {t.name: t for t in (await direct.list_tools()).tools}
        async with (
            running_gateway({"upstreams": {"alpha": {"url": url}}}) as gw,
            Client(gw.url, mode=mode) as client,
        ):
            public = {t.name: t for t in (await client.list_tools()).tools}
    for name, tool in original.items():
        seen = public[f"alpha__{name}"]
        assert seen.description == tool.description
        assert seen.input_schema == tool.input_schema
        assert seen.output_schema == tool.output_schema
        assert seen.annotations == tool.annotations


@pytest.mark.parametrize("mode", MODES)
async def test_structured_content_images_and_is_error_pass_through(mode: str) -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode=mode) as client:
        weather = await client.call_tool("alpha__weather", {"city": "Oslo"})
        assert weather.structured_content == {"city": "Oslo", "celsius": 21.5}
        picture = await client.call_tool("alpha__picture", {})
        image = picture.content[0]
        assert isinstance(image, types.ImageContent)
        assert image.mime_type == "image/png"
        broken = await client.call_tool("alpha__broken", {})
        assert broken.is_error
        assert "alpha exploded" in str(broken.content[0])


@pytest.mark.parametrize("mode", MODES)
async def test_invalid_arguments_are_rejected_before_they_reach_the_upstream(mode: str) -> None:
    async with two_upstreams() as (gw, calls), Client(gw.url, mode=mode) as client:
        wrong_type = await client.call_tool("alpha__echo", {"text": 42})
        missing = await client.call_tool("alpha__echo", {})
    assert wrong_type.is_error
    assert missing.is_error
    assert "Invalid arguments for tool 'alpha__echo'" in str(wrong_type.content[0])
    assert "42 is not of type 'string'" in str(wrong_type.content[0])
    assert "'text' is a required property" in str(missing.content[0])
    assert calls == []


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_names_get_errors_that_name_them(mode: str) -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode=mode) as client:
        tool = await client.call_tool("alpha__nope", {})
        assert tool.is_error
        assert "alpha__nope" in str(tool.content[0])
        with pytest.raises(MCPError, match="alpha__missing"):
            await client.get_prompt("alpha__missing", {})
        with pytest.raises(MCPError, match=r"nowhere://x"):
            await client.read_resource("nowhere://x")


@pytest.mark.parametrize("mode", MODES)
async def test_prompts_are_namespaced_and_rendered_by_their_upstream(mode: str) -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode=mode) as client:
        listed = {p.name: p for p in (await client.list_prompts()).prompts}
        result = await client.get_prompt("alpha__greet", {"name": "Ada"})
    assert result.messages[0].content == types.TextContent(type="text", text="Hello, Ada!")
    # Its arguments as the upstream lists them, their titles too (FastMCP 4.2 keeps them).
    arguments = listed["alpha__greet"].arguments or []
    assert [(a.name, a.title, a.required) for a in arguments] == [("name", "Name to greet", True)]


@pytest.mark.parametrize("mode", MODES)
async def test_resources_keep_unique_uris_and_qualify_shared_ones(mode: str) -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode=mode) as client:
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"alpha://only", "alpha+shared://readme", "beta+shared://readme"} <= uris
        assert "shared://readme" not in uris
        only = await client.read_resource("alpha://only")
        beta = await client.read_resource("beta+shared://readme")
    assert isinstance(only.contents[0], types.TextResourceContents)
    assert only.contents[0].text == "only alpha"
    assert isinstance(beta.contents[0], types.TextResourceContents)
    assert beta.contents[0].text == "beta readme"
    # Under the URI read: the upstream's own (shared://readme) is nobody's in the catalog.
    assert (only.contents[0].uri, beta.contents[0].uri) == ("alpha://only", "beta+shared://readme")


@pytest.mark.parametrize("mode", MODES)
async def test_reads_through_a_resource_template_reach_the_owning_upstream(mode: str) -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode=mode) as client:
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert "alpha://items/{item}" in templates
        result = await client.read_resource("alpha://items/42")
    assert isinstance(result.contents[0], types.TextResourceContents)
    assert result.contents[0].text == "alpha item 42"


async def test_include_exclude_rename_and_prefix_shape_the_catalog() -> None:
    filters = {"include": ["e*", "w*"], "exclude": ["weather"], "rename": {"echo": "say"}}
    async with two_upstreams(**filters) as (gw, _), Client(gw.url) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "alpha__say" in names
        assert not {"alpha__echo", "alpha__weather", "alpha__picture"} & names
        said = await client.call_tool("alpha__say", {"text": "renamed"})
    assert said.content[0] == types.TextContent(type="text", text="renamed")


async def test_prefix_off_exposes_the_original_names() -> None:
    calls: list[dict[str, Any]] = []
    async with serving_upstream(alpha_server(calls)) as url:
        config = {"upstreams": {"alpha": {"url": url, "prefix": False}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            assert "echo" in {t.name for t in (await client.list_tools()).tools}


async def test_a_start_up_collision_is_an_error_naming_both_upstreams() -> None:
    async with serving_upstream(alpha_server([])) as alpha, serving_upstream(beta_server()) as beta:
        config = {
            "upstreams": {"alpha": {"url": alpha, "prefix": False}, "beta": {"url": beta, "prefix": False}}
        }
        with pytest.raises(
            ConfigError, match=r"tool name 'echo' is produced by both upstream 'alpha'.*'beta'"
        ):
            async with running_gateway(config):
                pass
        config["upstreams"]["beta"]["rename"] = {"echo": "shout"}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            assert {"echo", "shout"} <= {t.name for t in (await client.list_tools()).tools}


async def test_upstream_instructions_reach_the_client_labelled_by_upstream() -> None:
    async with two_upstreams() as (gw, _), Client(gw.url, mode="legacy") as client:
        assert client.instructions is not None
        assert "[alpha] Alpha does echoes." in client.instructions


async def test_healthz_answers_and_readyz_is_200_when_every_upstream_is_up() -> None:
    async with two_upstreams() as (gw, _), httpx.AsyncClient(base_url=gw.base) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


async def test_many_concurrent_clients_get_their_own_answers() -> None:
    async with two_upstreams() as (gw, _):
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            async with Client(gw.url, mode="legacy" if i % 2 else "auto") as client:
                result = await client.call_tool("alpha__echo", {"text": f"caller-{i}"})
                results[i] = str(result.content[0].text)  # type: ignore[union-attr]

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(one, i)
    assert results == {i: f"caller-{i}" for i in range(16)}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_relayed_results_do_not_carry_the_upstreams_identity(mode: str) -> None:
    upstream = FastMCP("upstream-identity")

    @upstream.tool
    def hello() -> str:
        return "hi"

    @upstream.prompt
    def greet() -> str:
        return "hello"

    async with (
        serving_upstream(upstream) as url,
        running_gateway({"upstreams": {"u": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        answers = [await client.call_tool("u__hello", {}), await client.get_prompt("u__greet")]
    for answer in answers:
        assert "upstream-identity" not in str(answer.meta or {})


def geo_upstream() -> FastMCP:
    server = FastMCP("geo")

    @server.tool
    def locate(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        return f"located in {region}"

    @server.tool
    def survey(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        return f"surveyed {region}"

    return server


def modern_call(tool: str, region: str, **headers: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A raw modern-era ``tools/call`` of ``tool`` with ``region`` and its headers (``headers`` added)."""
    return modern_request(tool, {"region": region}, **headers)


def modern_request(
    tool: str, arguments: dict[str, Any], **headers: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A raw modern-era ``tools/call`` of ``tool`` and its headers (``headers`` added)."""
    meta = {
        types.PROTOCOL_VERSION_META_KEY: MODERN,
        types.CLIENT_CAPABILITIES_META_KEY: {},
        types.CLIENT_INFO_META_KEY: {"name": "raw", "version": "1"},
    }
    params = {"name": tool, "arguments": arguments, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    return body, {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": tool,
        **headers,
    }


def served_count(scraped: str, method: str) -> float:
    """How many ``method`` requests the gateway's server metric counted."""
    family = "mcp_server_operation_duration_seconds_count{"
    lines = [line for line in scraped.splitlines() if line.startswith(family)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if f'mcp_method_name="{method}"' in line)


def refusals_counted(scraped: str, reason: str) -> float:
    """How many refusals for ``reason`` the gateway's metric counted."""
    family = "agent_gateway_refusals_total{"
    lines = [line for line in scraped.splitlines() if line.startswith(family)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if f'reason="{reason}"' in line)


async def test_a_modern_calls_mcp_param_headers_are_checked_against_the_tools_schema(tmp_path: Path) -> None:
    # The gateway answers the SDK's schema lookup from its catalog (server.py): a header that
    # disagrees with its argument is still refused, as the spec requires, before any upstream.
    async with (
        serving_upstream(geo_upstream()) as url,
        gateway_process({"upstreams": {"geo": {"url": url}}}, tmp_path) as base,
        httpx.AsyncClient() as http,
    ):
        body, headers = modern_call("geo__locate", "eu")
        agreeing = await http.post(f"{base}/mcp", json=body, headers=headers | {"mcp-param-region": "eu"})
        disagreeing = await http.post(f"{base}/mcp", json=body, headers=headers | {"mcp-param-region": "us"})
        scraped = (await http.get(f"{base}/metrics")).text
    assert agreeing.status_code == 200, agreeing.text
    assert agreeing.json()["result"]["content"][0]["text"] == "located in eu"
    assert disagreeing.status_code == 400
    assert disagreeing.json()["error"]["code"] == types.HEADER_MISMATCH
    assert served_count(scraped, "tools/call") == 1  # the mismatch never reached dispatch
    assert served_count(scraped, "tools/list") == 0  # no listing per call to find the schema


TOKEN = "geo-token-0123456789abcdef"


async def test_with_client_policies_each_request_is_counted_once_and_checked_against_its_own_view(
    tmp_path: Path,
) -> None:
    # With policies the schema lookup is the caller's own (admission's client), so the SDK
    # runs no tools/list of its own: each request is one rate-limit token, one span, one
    # metric, one audit record, and a tool outside the policy is not even header-checked.
    policy = {"tools": ["geo__locate"], "rate_limit": {"per_minute": 1, "burst": 3}}
    auth = {
        "mode": "bearer",
        "tokens": [{"name": "geo-client", "token": TOKEN, "policy": "mapper"}],
        "policies": {"mapper": policy},
    }
    audit = tmp_path / "audit.jsonl"
    config = {"auth": auth, "audit": {"path": str(audit)}, "server": {"public_health": "full"}}
    async with (
        serving_upstream(geo_upstream()) as url,
        gateway_process({"upstreams": {"geo": {"url": url}}, **config}, tmp_path) as base,
        httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}) as http,
    ):
        answers = []
        asked = [
            ("geo__locate", "eu"),
            ("geo__locate", "us"),
            ("geo__survey", "us"),
            ("geo__locate", "eu"),
        ]
        for tool, region in asked:
            body, headers = modern_call(tool, region, **{"mcp-param-region": "eu"})
            answers.append(await http.post(f"{base}/mcp", json=body, headers=headers))
        scraped = (await http.get(f"{base}/metrics")).text
    agreeing, disagreeing, hidden, over = answers
    assert agreeing.json()["result"]["content"][0]["text"] == "located in eu"
    assert (disagreeing.status_code, disagreeing.json()["error"]["code"]) == (400, types.HEADER_MISMATCH)
    # Outside the policy: refused by it, never header-checked (its schema is not told).
    assert hidden.status_code == 200
    assert hidden.json()["result"]["isError"]
    assert "not allowed" in str(hidden.json()["result"])
    assert over.status_code == 429  # the fourth request: three tokens, one each
    assert served_count(scraped, "tools/list") == 0
    assert served_count(scraped, "tools/call") == 2  # the header mismatch never reached dispatch
    assert refusals_counted(scraped, "checks") == 1  # but it was refused, and counted so
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    calls = [(r["name"], r["outcome"]) for r in records if r["method"] == "tools/call"]
    assert calls == [
        ("geo__locate", "ok"),
        ("geo__locate", "refused"),  # the header mismatch: billed a token, so recorded
        ("geo__survey", "refused"),
        ("geo__locate", "refused"),
    ]
    mismatch = [r for r in records if r["method"] == "tools/call"][1]
    assert mismatch["detail"] == disagreeing.json()["error"]["message"]


async def test_each_forwarded_request_of_a_modern_client_is_one_downstream_session() -> None:
    # A modern-era request is its own session, opened once by the pipeline. A completion
    # used to be opened twice: once by FastMCP's middleware, once by the pipeline.
    docs = FastMCP("docs")

    @docs.prompt
    def brief(topic: str) -> str:
        return f"brief on {topic}"

    @docs.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> list[str]:
        return ["alpha"]

    @docs.tool
    def echo(text: str) -> str:
        return text

    prompt = types.PromptReference(type="ref/prompt", name="docs__brief")
    async with (
        serving_upstream(docs) as url,
        running_gateway({"upstreams": {"docs": {"url": url}}}) as gw,
        Client(gw.url, mode="auto") as client,
    ):
        sessions = gw.gateway.sessions
        before = sessions.opened
        completed = await client.complete(prompt, {"name": "topic", "value": "a"})
        await client.get_prompt("docs__brief", {"topic": "x"})
        await client.call_tool("docs__echo", {"text": "x"})
        opened, live = sessions.opened - before, len(sessions.live)
    assert completed.completion.values == ["alpha"]
    assert opened == 3
    assert live == 0  # each ended with its request
