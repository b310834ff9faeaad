"""A stdio upstream with the fixture tools, prompts and resources of the MCP conformance suite.

``@modelcontextprotocol/conformance`` tests a server by calling fixtures it names in each
server scenario's description (``npx @modelcontextprotocol/conformance list --server``; the
texts are in its ``dist/index.js``): ``test_simple_text``, ``test://static-text``,
``test_prompt_with_arguments`` and so on. The suite ships no server of its own, so this one
implements them, with exactly those names and the results the scenarios describe.
tests/e2e/test_conformance.py serves it through the gateway with ``prefix: false``, so the
suite sees the names it expects.

Sampling and elicitation work in both protocol eras: on a handshake-era (2025-11-25)
connection the tool sends the request to its client and waits; on a 2026-07-28 one, which
has no server-to-client requests, it answers ``InputRequiredResult`` and reads the client's
answer when the call is retried (SEP-2322).
"""

from __future__ import annotations

import base64
import io
import json
import struct
import wave
import zlib
from typing import Any

import anyio
import mcp_types as types
from fastmcp import Context, FastMCP
from fastmcp.prompts import Message
from fastmcp.tools.base import Tool, ToolResult
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

# dereference_schemas=False: the JSON Schema 2020-12 scenario checks that `$defs` is listed
# as written, which FastMCP's default (inline every `$ref`, drop `$defs`) would not do.
server = FastMCP(
    "conformance-fixture", instructions="The MCP conformance suite's fixtures.", dereference_schemas=False
)


def _png_1x1_red() -> bytes:
    """A minimal PNG: one red pixel (8-bit RGB)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then R G B
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _wav_silence() -> bytes:
    """A minimal WAV: 10 ms of 8 kHz mono 16-bit silence."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 80)
    return buffer.getvalue()


PNG = base64.b64encode(_png_1x1_red()).decode()
WAV = base64.b64encode(_wav_silence()).decode()
STEP = 0.05
"""The ~50 ms pause the logging and progress scenarios ask for between notifications."""


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG, mime_type="image/png")


def _embedded(uri: str, mime_type: str, text: str) -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource", resource=types.TextResourceContents(uri=uri, mime_type=mime_type, text=text)
    )


# -- tools: content types -----------------------------------------------------------------


@server.tool(description="Returns simple text content.")
def test_simple_text() -> types.CallToolResult:
    return types.CallToolResult(content=[_text("This is a simple text response for testing.")])


@server.tool(description="Returns image content (a 1x1 red PNG).")
def test_image_content() -> types.CallToolResult:
    return types.CallToolResult(content=[_image()])


@server.tool(description="Returns audio content (a short silent WAV).")
def test_audio_content() -> types.CallToolResult:
    return types.CallToolResult(content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")])


@server.tool(description="Returns an embedded text resource.")
def test_embedded_resource() -> types.CallToolResult:
    resource = _embedded("test://embedded-resource", "text/plain", "This is an embedded resource content.")
    return types.CallToolResult(content=[resource])


@server.tool(description="Returns text, image and embedded resource content together.")
def test_multiple_content_types() -> types.CallToolResult:
    data = json.dumps({"test": "data", "value": 123}, separators=(",", ":"))
    return types.CallToolResult(
        content=[
            _text("Multiple content types test:"),
            _image(),
            _embedded("test://mixed-content-resource", "application/json", data),
        ]
    )


@server.tool(description="Always fails: returns a tool error result.")
def test_error_handling() -> types.CallToolResult:
    return types.CallToolResult(
        content=[_text("This tool intentionally returns an error for testing")], is_error=True
    )


# -- tools: notifications during a call ---------------------------------------------------


@server.tool(description="Sends three info log messages while it runs.")
async def test_tool_with_logging(ctx: Context) -> types.CallToolResult:
    await ctx.info("Tool execution started")
    await anyio.sleep(STEP)
    await ctx.info("Tool processing data")
    await anyio.sleep(STEP)
    await ctx.info("Tool execution completed")
    return types.CallToolResult(content=[_text("Tool with logging executed successfully")])


@server.tool(description="Reports progress 0/100, 50/100, 100/100 while it runs.")
async def test_tool_with_progress(ctx: Context) -> types.CallToolResult:
    await ctx.report_progress(0, 100)
    await anyio.sleep(STEP)
    await ctx.report_progress(50, 100)
    await anyio.sleep(STEP)
    await ctx.report_progress(100, 100)
    return types.CallToolResult(content=[_text("Tool with progress executed successfully")])


@server.tool(description="The SSE polling scenario's tool (SEP-1699): closes its stream where it can.")
async def test_reconnection(ctx: Context) -> types.CallToolResult:
    # A no-op on stdio; on Streamable HTTP with an event store the client re-attaches.
    await ctx.close_sse_stream()
    await anyio.sleep(STEP)
    return types.CallToolResult(content=[_text("Reconnection test completed successfully")])


# -- tools: input from the client -----------------------------------------------------------

_ANSWER = "answer"
"""The key of the one input request a tool makes (2026-07-28 rounds)."""


async def _ask(ctx: Context, request: types.CreateMessageRequest | types.ElicitRequest) -> Any:
    """The client's answer to ``request``, or an ``InputRequiredResult`` asking for it.

    Handshake era: a server-to-client request related to the call. 2026-07-28: the first
    round returns the request for the client to fulfil; the retry carries the answer.
    """
    rc = ctx.request_context
    if rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answered = (ctx.input_responses or {}).get(_ANSWER)
        if answered is None:
            return types.InputRequiredResult(input_requests={_ANSWER: request})
        return answered
    result_type = (
        types.CreateMessageResult if request.method == "sampling/createMessage" else types.ElicitResult
    )
    return await ctx.session.send_request(
        request,
        result_type,
        metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
    )


def _elicitation(message: str, schema: dict[str, Any]) -> types.ElicitRequest:
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _elicited(prefix: str, answer: Any) -> Any:
    if isinstance(answer, types.InputRequiredResult):
        return answer
    if not isinstance(answer, types.ElicitResult):
        return types.CallToolResult(content=[_text(f"unexpected answer: {answer!r}")], is_error=True)
    content = json.dumps(answer.content)
    return types.CallToolResult(content=[_text(f"{prefix}action={answer.action}, content={content}")])


@server.tool(description="Asks the client's model to answer `prompt` (sampling/createMessage).")
async def test_sampling(prompt: str, ctx: Context) -> Any:
    request = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=_text(prompt))], max_tokens=100
        )
    )
    answer = await _ask(ctx, request)
    if isinstance(answer, types.InputRequiredResult):
        return answer
    if not isinstance(answer, types.CreateMessageResult):
        return types.CallToolResult(content=[_text(f"unexpected answer: {answer!r}")], is_error=True)
    text = answer.content.text if isinstance(answer.content, types.TextContent) else str(answer.content)
    return types.CallToolResult(content=[_text(f"LLM response: {text}")])


@server.tool(description="Asks the user for a username and an email (elicitation/create).")
async def test_elicitation(message: str, ctx: Context) -> Any:
    schema = {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    }
    return _elicited("User response: ", await _ask(ctx, _elicitation(message, schema)))


@server.tool(description="Elicitation whose schema has a default for every primitive type (SEP-1034).")
async def test_elicitation_sep1034_defaults(ctx: Context) -> Any:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    request = _elicitation("Please review these values (defaults provided)", schema)
    return _elicited("Elicitation completed: ", await _ask(ctx, request))


@server.tool(description="Elicitation whose schema has all five enum variants (SEP-1330).")
async def test_elicitation_sep1330_enums(ctx: Context) -> Any:
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {
                "type": "string",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"},
                ],
            },
            "legacyEnum": {
                "type": "string",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
            },
            "titledMulti": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"},
                    ]
                },
            },
        },
        "required": [],
    }
    request = _elicitation("Please choose from these enum variants", schema)
    return _elicited("Elicitation completed: ", await _ask(ctx, request))


# -- a tool with a JSON Schema 2020-12 input schema (SEP-1613) ------------------------------


class _SchemaTool(Tool):
    """A tool whose input schema is given as it is, not derived from a signature."""

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(content=[_text(f"received {json.dumps(arguments, sort_keys=True)}")])


server.add_tool(
    _SchemaTool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features",
        parameters={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    )
)


# -- resources ----------------------------------------------------------------------------


@server.resource(
    "test://static-text", name="static-text", description="A static text resource", mime_type="text/plain"
)
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource(
    "test://static-binary",
    name="static-binary",
    description="A static binary resource",
    mime_type="image/png",
)
def static_binary() -> bytes:
    return _png_1x1_red()


@server.resource(
    "test://watched-resource",
    name="watched-resource",
    description="A resource clients subscribe to",
    mime_type="text/plain",
)
def watched_resource() -> str:
    return "Watched resource content"


@server.resource(
    "test://template/{id}/data",
    name="template-data",
    description="A resource template with an id parameter",
    mime_type="application/json",
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"}, separators=(",", ":"))


# -- prompts ------------------------------------------------------------------------------


@server.prompt(description="A simple prompt without arguments")
def test_simple_prompt() -> list[Message]:
    return [Message("This is a simple prompt for testing.")]


@server.prompt(description="A prompt with two required arguments")
def test_prompt_with_arguments(arg1: str, arg2: str) -> list[Message]:
    return [Message(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]


@server.prompt(description="A prompt embedding the resource named by resourceUri")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[Message]:  # the suite's argument name
    return [
        Message(_embedded(resourceUri, "text/plain", "Embedded resource content for testing.")),
        Message("Please process the embedded resource above."),
    ]


@server.prompt(description="A prompt with image content")
def test_prompt_with_image() -> list[Message]:
    return [Message(_image()), Message("Please analyze the image above.")]


@server.completion
def complete(
    ref: types.PromptReference | types.ResourceTemplateReference,
    argument: types.CompletionArgument,
    context: types.CompletionContext | None,
) -> list[str]:
    """Candidates for ``test_prompt_with_arguments``'s arguments and the template's ``id``."""
    candidates = {"arg1": ["paris", "park", "party"], "arg2": ["world", "word"], "id": ["123", "456"]}
    return [c for c in candidates.get(argument.name, []) if c.startswith(argument.value)]


# -- subscriptions --------------------------------------------------------------------------
# FastMCP serves neither: handshake-era clients subscribe with resources/subscribe, 2026-07-28
# ones with a subscriptions/listen stream. Nothing here changes, so no update is ever sent.

_subscribed: set[str] = set()


async def _subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    _subscribed.add(params.uri)
    return types.EmptyResult()


async def _unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    _subscribed.discard(params.uri)
    return types.EmptyResult()


_lowlevel = server._mcp_server  # pyright: ignore[reportPrivateUsage]
_lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, _subscribe)
_lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, _unsubscribe)
_lowlevel.add_request_handler(
    "subscriptions/listen",
    types.SubscriptionsListenRequestParams,
    ListenHandler(InMemorySubscriptionBus()),
)


if __name__ == "__main__":
    server.run(show_banner=False, log_level="WARNING")
