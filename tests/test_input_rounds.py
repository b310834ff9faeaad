"""A modern upstream's input requests (``InputRequiredResult``) on ``prompts/get`` and
``resources/read`` reach a modern client as they are, and its retry carrying the answers
reaches the upstream, which records them (as for ``tools/call``). A handshake-era client has
them answered through the gateway's own client, as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from tests.support import running_gateway, serving

SCHEMA = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}


def asking(answers: list[str]) -> Server:
    """A low-level upstream whose prompt ``greeting`` and resource ``ask://name`` first ask for
    a name (an elicitation, as an input request), then use the answer, which they record."""

    def question(message: str) -> types.InputRequiredResult:
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message=message, requested_schema=SCHEMA)
        )
        return types.InputRequiredResult(
            input_requests={"name": request}, request_state=f"state of {message}"
        )

    def answered(params: Any) -> str | None:
        if not params.input_responses:
            return None
        answer = params.input_responses["name"]
        assert isinstance(answer, types.ElicitResult)
        value = f"{(answer.content or {}).get('value')} ({params.request_state})"
        answers.append(value)
        return value

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="greeting")])

    async def get_prompt(ctx: Any, params: Any) -> types.GetPromptResult | types.InputRequiredResult:
        if (name := answered(params)) is None:
            return question("who is greeted?")
        text = types.TextContent(text=f"hello {name}")
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri="ask://name", name="name")])

    async def read_resource(ctx: Any, params: Any) -> types.ReadResourceResult | types.InputRequiredResult:
        if (name := answered(params)) is None:
            return question("whose file?")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, text=f"file of {name}")]
        )

    return Server(
        "asking",
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


@asynccontextmanager
async def asking_gateway(answers: list[str]) -> AsyncIterator[str]:
    async with (
        serving(asking(answers).streamable_http_app()) as base,
        running_gateway({"upstreams": {"up": {"url": f"{base}/mcp"}}}) as gw,
    ):
        yield gw.url


async def elicited(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"value": "ada"})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstreams_input_requests_on_a_prompt_and_a_read_are_answered_by_the_client(
    mode: str,
) -> None:
    answers: list[str] = []
    async with (
        asking_gateway(answers) as url,
        Client(url, mode=mode, elicitation_callback=elicited) as client,
    ):
        prompt = await client.get_prompt("up__greeting")
        read = await client.read_resource("ask://name")
    text = prompt.messages[0].content
    assert isinstance(text, types.TextContent)
    assert text.text == "hello ada (state of who is greeted?)"
    contents = read.contents[0]
    assert isinstance(contents, types.TextResourceContents)
    assert contents.text == "file of ada (state of whose file?)"
    # The upstream had the client's answer, with the state it handed out.
    assert answers == ["ada (state of who is greeted?)", "ada (state of whose file?)"]


def endless() -> Server:
    """A low-level upstream whose prompt and resource ask again whatever they are answered."""

    def again(ctx: Any, params: Any) -> Any:
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message="again?", requested_schema=SCHEMA)
        )
        return types.InputRequiredResult(input_requests={"name": request}, request_state="s")

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="loop")])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri="loop://x", name="x")])

    async def asked(ctx: Any, params: Any) -> Any:
        return again(ctx, params)

    return Server(
        "endless",
        on_list_prompts=list_prompts,
        on_get_prompt=asked,
        on_list_resources=list_resources,
        on_read_resource=asked,
    )


async def test_an_upstream_that_never_stops_asking_a_handshake_era_client_is_named() -> None:
    async with (
        serving(endless().streamable_http_app()) as base,
        running_gateway({"upstreams": {"up": {"url": f"{base}/mcp"}}}) as gw,
        Client(gw.url, mode="legacy", elicitation_callback=elicited) as client,
    ):
        errors = []
        for ask in (lambda: client.get_prompt("up__loop"), lambda: client.read_resource("loop://x")):
            with pytest.raises(MCPError) as caught:
                await ask()
            errors.append(caught.value.error.message)
    # Before: -32603 "Internal server error" (the SDK's rounds bound escaped untranslated).
    assert errors == [
        "upstream 'up': prompt 'loop': still asking for input after 10 rounds",
        "upstream 'up': resource 'loop://x': still asking for input after 10 rounds",
    ]


def signing_in(answers: list[str]) -> Server:
    """A low-level modern upstream whose prompt ``signin`` first asks the client to open a URL
    (an input request in URL mode: no ``elicitationId`` in 2026-07-28), then records the answer."""

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="signin")])

    async def get_prompt(ctx: Any, params: Any) -> types.GetPromptResult | types.InputRequiredResult:
        if not params.input_responses:
            url = types.ElicitRequestURLParams(message="Sign in", url="https://example.com/a")
            return types.InputRequiredResult(input_requests={"auth": types.ElicitRequest(params=url)})
        answers.append(params.input_responses["auth"].action)
        return types.GetPromptResult(
            messages=[types.PromptMessage(role="user", content=types.TextContent(text="in"))]
        )

    return Server("signing", on_list_prompts=list_prompts, on_get_prompt=get_prompt)


async def test_a_modern_upstreams_url_elicitation_reaches_a_handshake_era_client_with_an_id() -> None:
    answers: list[str] = []
    asked: list[str | None] = []

    async def opened(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.elicitation_id)
        return types.ElicitResult(action="accept")

    async with (
        serving(signing_in(answers).streamable_http_app()) as base,
        running_gateway({"upstreams": {"up": {"url": f"{base}/mcp"}}}) as gw,
        Client(gw.url, mode="legacy", elicitation_callback=opened) as client,
    ):
        result = await client.get_prompt("up__signin")
    # Before: the client refused it (2025-11-25 requires the id): "Invalid request parameters".
    assert result.messages[0].content == types.TextContent(text="in")
    assert answers == ["accept"]
    assert [bool(one) for one in asked] == [True]
