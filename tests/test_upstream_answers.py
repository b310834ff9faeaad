"""An upstream's own answers cross the gateway as a direct connection gets them: its JSON-RPC
errors with their code and data (a tool call's too), and no question a client did not declare
it can answer. Each test asks the upstream directly first, then through the gateway, with the
official client in the same mode, in every pairing of the client's era and the upstream's."""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse

from agent_gateway.downstream.input_requests import unsupported
from tests.support import intercepted, running_gateway, serving, serving_upstream

MODES = ["legacy", "auto"]
PROTOCOLS = ["legacy", "auto"]  # the upstream's era, as the gateway's `protocol:` pins it
BOUND = 10.0


def direct_mode(mode: str, protocol: str) -> str:
    """The client mode that reaches the upstream in the era the gateway speaks to it."""
    return "legacy" if protocol == "legacy" else mode


async def outcome(request: Any) -> Any:
    """A request's result, or its JSON-RPC error as (code, message, data)."""
    with anyio.fail_after(BOUND):
        try:
            result = await request
        except MCPError as exc:
            return ("error", exc.error.code, exc.error.message, exc.error.data)
    return ("result", result.is_error if isinstance(result, types.CallToolResult) else None)


# --- An upstream's JSON-RPC error keeps its code and data ------------------------------------

INVALID = {"code": types.INVALID_PARAMS, "message": "bad topic", "data": {"field": "topic", "allowed": ["a"]}}
URL_REQUIRED = {
    "code": types.URL_ELICITATION_REQUIRED,
    "message": "URL elicitation required",
    "data": {
        "elicitations": [
            {"mode": "url", "message": "Sign in", "url": "https://example.com/auth", "elicitationId": "e1"}
        ]
    },
}


def refusing_upstream() -> Any:
    """FastMCP, except that tools/call, prompts/get and resources/read are answered with a
    JSON-RPC error carrying `data`, as a low-level SDK server raising MCPError(data=...) or
    UrlElicitationRequiredError answers them."""
    server = FastMCP("refusing")

    @server.tool
    def sign_in() -> str:
        return "x"

    @server.prompt
    def brief(topic: str) -> str:
        return topic

    @server.resource("note://private")
    def note() -> str:
        return "n"

    async def intercept(scope: Any, message: dict[str, Any], send: Any) -> bool:
        method = message.get("method")
        if method not in ("tools/call", "prompts/get", "resources/read"):
            return False
        error = URL_REQUIRED if method == "tools/call" else INVALID

        async def nothing() -> Any:
            return {"type": "http.request", "body": b""}

        await JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error})(scope, nothing, send)
        return True

    return intercepted(server, intercept)


async def _errors(client: Client, prefix: str) -> dict[str, Any]:
    return {
        "prompts/get": await outcome(client.get_prompt(f"{prefix}brief", {"topic": "z"})),
        "resources/read": await outcome(client.read_resource("note://private")),
    }


def _code_and_data(outcomes: dict[str, Any]) -> dict[str, Any]:
    """Each outcome without its message (the gateway prefixes the upstream's name to it)."""
    return {m: (o[0], o[1], o[3]) if o[0] == "error" else o for m, o in outcomes.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", MODES)
async def test_an_upstreams_json_rpc_error_reaches_the_client_with_its_data(mode: str, protocol: str) -> None:
    async with serving(refusing_upstream()) as base:
        url = f"{base}/mcp"
        async with Client(url, mode=direct_mode(mode, protocol)) as direct:  # type: ignore[arg-type]
            expected = await _errors(direct, "")
        config = {"upstreams": {"up": {"url": url, "protocol": protocol}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            through = await _errors(client, "up__")
    assert expected["prompts/get"] == ("error", *INVALID.values())
    assert _code_and_data(through) == _code_and_data(expected)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", MODES)
async def test_an_upstreams_url_elicitation_required_error_on_a_tool_call_reaches_the_client(
    mode: str, protocol: str
) -> None:
    async with serving(refusing_upstream()) as base:
        url = f"{base}/mcp"
        async with Client(url, mode=direct_mode(mode, protocol)) as direct:  # type: ignore[arg-type]
            expected = await outcome(direct.call_tool("sign_in", {}))
        config = {"upstreams": {"up": {"url": url, "protocol": protocol}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            through = await outcome(client.call_tool("up__sign_in", {}))
    assert expected == ("error", *URL_REQUIRED.values())
    # The client needs the code and data.elicitations to open the URL and retry; each under
    # an id of the gateway's (tests/security/test_elicitation_ids.py), its message naming the
    # upstream that asks (upstreams/asking.py).
    shown = through[3]["elicitations"][0].pop("elicitationId")
    expected[3]["elicitations"][0].pop("elicitationId")
    assert shown.startswith("gw-")
    said = through[3]["elicitations"][0]["message"]
    assert said == "[up] " + expected[3]["elicitations"][0]["message"]
    through[3]["elicitations"][0]["message"] = expected[3]["elicitations"][0]["message"]
    assert _code_and_data({"tools/call": through}) == _code_and_data({"tools/call": expected})


# --- No question a client did not declare it can answer ---------------------------------------


def _modern(ctx: Context) -> bool:
    request = ctx.request_context
    return request is not None and request.protocol_version in MODERN_PROTOCOL_VERSIONS


def sampling_upstream() -> FastMCP:
    server = FastMCP("samp")
    tool = types.Tool(name="lookup", input_schema={"type": "object", "properties": {}})
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))

    @server.tool
    async def sample_with_tools(ctx: Context) -> str | types.InputRequiredResult:
        if not _modern(ctx):
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                reply = await ctx.session.create_message(
                    messages=[message], max_tokens=50, tools=[tool], related_request_id=ctx.request_id
                )
            return str(reply.content)
        if ctx.input_responses is None:
            request = types.CreateMessageRequest(
                params=types.CreateMessageRequestParams(messages=[message], max_tokens=50, tools=[tool])
            )
            return types.InputRequiredResult(input_requests={"llm": request})
        return str(ctx.input_responses["llm"].content)  # type: ignore[union-attr]

    return server


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", MODES)
async def test_sampling_with_tools_never_reaches_a_client_that_did_not_declare_sampling_tools(
    mode: str, protocol: str
) -> None:
    asked: list[Any] = []

    async def sampler(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.tools)  # the client declared sampling, not sampling.tools
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="ok"), model="m"
        )

    async with serving_upstream(sampling_upstream()) as url:
        async with Client(url, mode=direct_mode(mode, protocol), sampling_callback=sampler) as direct:  # type: ignore[arg-type]
            with anyio.fail_after(BOUND):
                await direct.call_tool("sample_with_tools", {})
        direct_asked = list(asked)
        asked.clear()
        config = {"upstreams": {"samp": {"url": url, "protocol": protocol}}}
        async with (
            running_gateway(config) as gw,
            Client(gw.url, mode=mode, sampling_callback=sampler) as client,  # type: ignore[arg-type]
        ):
            with anyio.fail_after(BOUND):
                await client.call_tool("samp__sample_with_tools", {})
    # Directly, the upstream's SDK refuses ("Client does not support sampling tools capability"):
    # the client is never asked. (A modern upstream behind a modern client is passed through.)
    assert asked == direct_asked


@pytest.mark.parametrize("mode", MODES)
async def test_sampling_with_tools_reaches_a_client_that_declared_sampling_tools(mode: str) -> None:
    # A shared upstream session tells a handshake-era upstream its client can answer everything
    # (upstreams/client_side.EVERYTHING): what it leaves out, the upstream never asks anyone.
    asked: list[Any] = []
    tools = types.SamplingCapability(tools=types.SamplingToolsCapability())

    async def sampler(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append([tool.name for tool in params.tools or []])
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="ok"), model="m"
        )

    options: dict[str, Any] = {"sampling_callback": sampler, "sampling_capabilities": tools}
    async with serving_upstream(sampling_upstream()) as url:
        config = {"upstreams": {"samp": {"url": url, "protocol": "legacy"}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode, **options) as client:  # type: ignore[arg-type]
            with anyio.fail_after(BOUND):
                result = await client.call_tool("samp__sample_with_tools", {})
    assert asked == [["lookup"]]
    assert not result.is_error, result


def test_a_url_elicitation_is_not_asked_of_a_client_that_declared_forms_only() -> None:
    # An empty elicitation capability is forms only (as before URL mode existed).
    url = types.ElicitRequest(
        params=types.ElicitRequestURLParams(
            message="Sign in", url="https://example.com/a", elicitation_id="e1"
        )
    )
    form = types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message="Name?", requested_schema={"type": "object", "properties": {}}
        )
    )
    forms_only = types.ClientCapabilities(elicitation=types.ElicitationCapability())
    urls_only = types.ClientCapabilities(
        elicitation=types.ElicitationCapability(url=types.UrlElicitationCapability())
    )
    refused = {
        (name, kind): (unsupported(caps, request) or types.ErrorData(code=0, message="asked")).message
        for name, caps in (("forms only", forms_only), ("urls only", urls_only))
        for kind, request in (("url", url), ("form", form))
    }
    assert refused == {
        (
            "forms only",
            "url",
        ): "agent-gateway: the client did not declare the capability for elicitation/create in url mode",
        ("forms only", "form"): "asked",
        ("urls only", "url"): "asked",
        (
            "urls only",
            "form",
        ): "agent-gateway: the client did not declare the capability for elicitation/create in form mode",
    }


def completing_upstream() -> FastMCP:
    server = FastMCP("auth")

    @server.tool
    async def completes(ctx: Context) -> str:
        """Ask the client by URL (elicitation e1), then tell it e1 is complete (2025-11-25)."""
        url = "https://example.com/auth"
        await ctx.session.elicit_url("Sign in", url, "e1", related_request_id=ctx.request_id)
        await ctx.session.send_elicit_complete("e1", related_request_id=ctx.request_id)
        return "done"

    return server


async def test_an_upstreams_elicitation_complete_notification_reaches_the_client_of_the_call() -> None:
    heard: list[str] = []
    asked: list[str] = []

    async def handler(message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            heard.append(message.params.elicitation_id)

    async def elicited(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.elicitation_id)
        return types.ElicitResult(action="accept")

    options: dict[str, Any] = {"message_handler": handler, "elicitation_callback": elicited}
    async with serving_upstream(completing_upstream()) as url:
        async with Client(url, mode="legacy", **options) as direct:
            await direct.call_tool("completes", {})
            with anyio.fail_after(BOUND):
                while not heard:
                    await anyio.sleep(0.01)
        config = {"upstreams": {"auth": {"url": url, "protocol": "legacy"}}}
        async with running_gateway(config) as gw, Client(gw.url, mode="legacy", **options) as client:
            result = await client.call_tool("auth__completes", {})
            with anyio.fail_after(BOUND):
                while len(heard) < 2:
                    await anyio.sleep(0.01)
    assert not result.is_error
    assert heard == asked  # directly, then through the gateway: under the id it was asked
    assert asked[0] == "e1"
    assert asked[1].startswith("gw-")
