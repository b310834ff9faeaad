"""A modern-era ``tools/call`` forwarded below the SDK's client (``upstreams/forwarding.py``),
against a real upstream: it must come back as the SDK's own call gives it, relay what the
upstream streams meanwhile, report failures as the SDK does, and cancel by closing its POST.

The gateway's own tests in the modern era (``test_proxying.py``, ``test_error_codes.py``,
``test_telemetry.py`` …) take this path too; these pin down the module itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio
import httpx2
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent_gateway.upstreams.forwarding import Forwarder, ToolCall
from agent_gateway.upstreams.http_client import UpstreamClient
from agent_gateway.upstreams.http_transport import AiohttpTransport
from agent_gateway.upstreams.pace import Pace
from tests.servers import recorder
from tests.support import Seen, serving, serving_upstream

BOUND = 10.0
CLIENTS = ("aiohttp", "httpx2")
"""The transport's own client, which the forwarder posts on straight (as the gateway's upstreams
are reached), and any other httpx2 client, which it posts through."""


def http_client(kind: str) -> httpx2.AsyncClient:
    if kind == "aiohttp":
        return UpstreamClient(wire=AiohttpTransport(max_connections=8, max_body_bytes=2**20))
    return httpx2.AsyncClient()


@pytest.fixture(params=CLIENTS)
def http(request: pytest.FixtureRequest) -> str:
    return request.param


@dataclass
class Relayed:
    """What the forwarder passed on to the session: log lines, and every notification."""

    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)
    notifications: list[Any] = field(default_factory=list)

    async def log(self, line: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(line)

    async def notify(self, notification: Any) -> None:
        self.notifications.append(notification)

    def forwarder(self, http: httpx2.AsyncClient, url: str) -> Forwarder:
        return Forwarder(http, url, 2**20, (self.log, self.notify), Pace("up", "up/1", None))


@asynccontextmanager
async def forwarding(
    kind: str, sink: Callable[[dict[str, Any]], None] = lambda _: None
) -> AsyncIterator[tuple[Forwarder, Client, Relayed]]:
    """A recorder upstream (what it records to ``sink``), a modern-era client of it, and a
    forwarder on its URL posting on a ``kind`` client."""
    relayed = Relayed()
    async with (
        serving_upstream(recorder.build(sink)) as url,
        Client(url, mode="auto") as client,
        http_client(kind) as http,
    ):
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
        await client.list_tools()  # as the gateway has: the SDK checks results against it
        yield relayed.forwarder(http, url), client, relayed


def call(client: Client, name: str, **arguments: Any) -> ToolCall:
    """A call of ``name`` with ``arguments``, no ``_meta`` and no progress relay."""
    return ToolCall(client, name, arguments)


async def test_a_call_comes_back_as_the_sdks_own_call_gives_it(http: str) -> None:
    async with forwarding(http) as (forwarder, client, _):
        with anyio.fail_after(BOUND):
            forwarded = await forwarder.call_tool(call(client, "tally", by=2))
            direct = await client.session.call_tool("tally", {"by": 3}, allow_input_required=True)
    assert isinstance(forwarded, types.CallToolResult)
    assert isinstance(direct, types.CallToolResult)
    assert forwarded.structured_content == {"result": 2}  # a session of its own: modern, no session
    assert forwarded.model_dump(exclude={"content", "structured_content"}) == direct.model_dump(
        exclude={"content", "structured_content"}
    )


async def test_progress_and_log_lines_on_the_stream_reach_the_caller_in_order(http: str) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with forwarding(http) as (forwarder, client, relayed):
        with anyio.fail_after(BOUND):
            steps = await forwarder.call_tool(ToolCall(client, "steps", {"count": 3}, None, on_progress))
            opted_in = {types.LOG_LEVEL_META_KEY: "debug"}
            said = await forwarder.call_tool(ToolCall(client, "say", {"text": "hello"}, opted_in))
    assert isinstance(steps, types.CallToolResult)
    assert not steps.is_error
    assert progress == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]
    assert isinstance(said, types.CallToolResult)
    assert [line.data["msg"] for line in relayed.logs] == ["hello"]  # FastMCP's shape of a log line
    # As the SDK's session does: the log line goes to the logging callback and the handler.
    assert [type(n) for n in relayed.notifications] == [types.LoggingMessageNotification]


async def test_a_tools_failure_comes_back_as_the_sdks_own_call_gives_it(http: str) -> None:
    async with forwarding(http) as (forwarder, client, _):
        with anyio.fail_after(BOUND):
            forwarded = await forwarder.call_tool(call(client, "no_such_tool"))
            direct = await client.session.call_tool("no_such_tool", {})
    assert isinstance(forwarded, types.CallToolResult)
    assert forwarded.is_error
    assert forwarded.content == direct.content


def answering(status: int, body: dict[str, Any] | None) -> Starlette:
    """An HTTP endpoint answering every POST with ``status`` and ``body`` (JSON)."""

    async def post(request: Request) -> Response:
        if body is None:
            return Response(status_code=status)
        return JSONResponse(body, status_code=status)

    return Starlette(routes=[Route("/mcp", post, methods=["POST"])])


REFUSED = {"jsonrpc": "2.0", "id": None, "error": {"code": -32042, "message": "not today"}}


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        pytest.param(200, {**REFUSED, "id": 1}, -32042, "not today", id="json-rpc-error"),
        pytest.param(400, REFUSED, -32042, "not today", id="json-rpc-error-at-400"),
        # No session in this era: a 404 says there is no such method.
        pytest.param(404, None, types.METHOD_NOT_FOUND, "Not Found", id="404"),
        pytest.param(500, None, types.INTERNAL_ERROR, "Server returned an error response", id="500"),
        pytest.param(
            202, None, types.INVALID_REQUEST, "server answered a request with 202 Accepted", id="202"
        ),
    ],
)
async def test_refusals_come_back_as_the_sdks_transport_reports_them(
    http: str, status: int, body: dict[str, Any] | None, code: int, message: str
) -> None:
    async with (
        forwarding(http) as (_, client, _),
        serving(answering(status, body)) as base,
        http_client(http) as posting,
    ):
        forwarder = Relayed().forwarder(posting, f"{base}/mcp")
        with anyio.fail_after(BOUND), pytest.raises(MCPError) as refused:
            await forwarder.call_tool(call(client, "tally", by=1))
    assert (refused.value.error.code, refused.value.error.message) == (code, message)


def answering_with(result: dict[str, Any]) -> Starlette:
    """An upstream answering every call with ``result``."""

    async def post(request: Request) -> Response:
        message = await request.json()
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})

    return Starlette(routes=[Route("/mcp", post, methods=["POST"])])


@pytest.mark.parametrize(
    ("structured", "refusal"),
    [
        pytest.param({"result": "two"}, "Invalid structured content returned by tool tally", id="off-schema"),
        pytest.param({}, "Invalid structured content returned by tool tally", id="field-missing"),
        pytest.param(None, "has an output schema but did not return structured content", id="none"),
    ],
)
async def test_a_result_off_its_tools_output_schema_is_refused_as_the_sdks_check_refuses_it(
    http: str, structured: dict[str, Any] | None, refusal: str
) -> None:
    # tally's output schema (from the upstream's listing): {"result": integer}, required.
    result: dict[str, Any] = {"content": [{"type": "text", "text": "2"}]}
    if structured is not None:
        result["structuredContent"] = structured
    async with (
        forwarding(http) as (_, client, _),
        serving(answering_with(result)) as base,
        http_client(http) as posting,
    ):
        forwarder = Relayed().forwarder(posting, f"{base}/mcp")
        with anyio.fail_after(BOUND), pytest.raises(RuntimeError, match=refusal):
            await forwarder.call_tool(call(client, "tally", by=1))
        result["structuredContent"] = {"result": 2}  # and the same tool's result on its schema passes
        with anyio.fail_after(BOUND):
            answer = await forwarder.call_tool(call(client, "tally", by=1))
    assert isinstance(answer, types.CallToolResult)
    assert answer.structured_content == {"result": 2}


async def test_a_result_the_quick_check_reads_apart_from_the_sdks_is_judged_by_the_sdks_check(
    http: str,
) -> None:
    # jsonschema-rs reads \D as ECMA-262's [^0-9]; Python's re (the SDK's check) as any
    # non-digit in Unicode: Arabic-Indic digits pass the first and fail the second.
    upstream = FastMCP("coded")

    @upstream.tool
    def code() -> Annotated[str, Field(pattern=r"^\D+$")]:
        """A code with no digit in it."""
        return "abc"

    result = {"content": [{"type": "text", "text": "x"}], "structuredContent": {"result": "\u0661\u0662"}}
    async with (
        serving_upstream(upstream) as url,
        Client(url, mode="auto") as client,
        serving(answering_with(result)) as base,
        http_client(http) as posting,
    ):
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert listed["code"].output_schema is not None
        forwarder = Relayed().forwarder(posting, f"{base}/mcp")
        with anyio.fail_after(BOUND), pytest.raises(RuntimeError, match="Invalid structured content"):
            await forwarder.call_tool(call(client, "code"))


def echoing_headers(seen: list[dict[str, str]]) -> Starlette:
    """An upstream answering every call with a result, recording each POST's headers; its
    first answer sets a cookie."""

    async def post(request: Request) -> Response:
        seen.append(dict(request.headers))
        message = await request.json()
        result = {"content": [{"type": "text", "text": "2"}], "structuredContent": {"result": 2}}
        answer = JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})
        if len(seen) == 1:
            answer.set_cookie("replica", "b")
        return answer

    return Starlette(routes=[Route("/mcp", post, methods=["POST"])])


async def test_a_call_carries_the_clients_headers_its_trace_context_its_cookies_and_credentials(
    http: str,
) -> None:
    seen: list[dict[str, str]] = []
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with (
        forwarding(http) as (_, client, _),
        serving(echoing_headers(seen)) as base,
        http_client(http) as posting,
        http_client(http) as fresh,  # no cookie in its jar
    ):
        posting.headers["x-team"] = "blue"
        forwarder = Relayed().forwarder(posting, f"{base}/mcp")
        with_credentials = Relayed().forwarder(fresh, f"{base}/mcp".replace("://", "://ann:secret@"))
        with anyio.fail_after(BOUND):
            for _ in range(2):
                answer = await forwarder.call_tool(
                    ToolCall(client, "tally", {"by": 2}, {"traceparent": traceparent})
                )
                assert isinstance(answer, types.CallToolResult)
                assert answer.structured_content == {"result": 2}
            await with_credentials.call_tool(ToolCall(client, "tally", {"by": 2}))
    first, second, third = seen
    assert third["authorization"] == "Basic YW5uOnNlY3JldA=="  # the URL's credentials, as httpx2 sends them
    assert first["x-team"] == second["x-team"] == "blue"  # the client's own headers
    assert first["traceparent"] == second["traceparent"] == traceparent  # the trace hook's
    assert (first["mcp-method"], first["content-type"]) == ("tools/call", "application/json")
    assert "cookie" not in first
    assert second["cookie"] == "replica=b"  # kept in the client's jar, as httpx2 keeps it


async def test_a_call_refused_for_a_stale_header_schema_lists_the_tool_again_and_is_sent_once_more(
    http: str,
) -> None:
    # Sent for a handshake-era caller (no one to pass a refusal to), as the SDK's own
    # Client.call_tool sends it: the upstream now wants the region in an Mcp-Param header.
    server = FastMCP("regions")
    routed: list[str] = []

    @server.tool
    def route(region: str) -> str:
        return region

    async with (
        serving_upstream(server) as url,
        Client(url, mode="auto") as client,
        http_client(http) as posting,
    ):
        await client.list_tools()
        server.local_provider.remove_tool("route")

        @server.tool(name="route")
        def route_by_header(
            region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
        ) -> str:
            routed.append(region)
            return region

        with anyio.fail_after(BOUND):
            answer = await Relayed().forwarder(posting, url).forward(call(client, "route", region="eu"), None)
    assert isinstance(answer, types.CallToolResult)
    assert not answer.is_error, answer.content
    assert routed == ["eu"]  # sent again once the listing named the header, and run once


async def test_a_cancelled_call_closes_its_post_and_the_upstream_stops_the_handler(http: str) -> None:
    seen = Seen()
    async with forwarding(http, seen) as (forwarder, client, _):
        with anyio.move_on_after(BOUND) as waiting:
            async with anyio.create_task_group() as tg:
                tg.start_soon(forwarder.call_tool, call(client, "wait", seconds=60))
                await seen.first("started")
                tg.cancel_scope.cancel()
            await seen.first("handler_cancelled")
    assert not waiting.cancelled_caught, f"the upstream never stopped the handler: {seen.events}"
