"""How the gateway answers a modern-era POST (``compat/exchange.py``): in the POST's task,
one JSON body for a call that sends nothing first, else the SDK's stream; anything else the
SDK's own entry answers."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import ServerRunner
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
from mcp.shared.transport_context import TransportContext
from mcp_types.version import LATEST_MODERN_VERSION
from starlette.datastructures import Headers

from agent_gateway.compat import exchange
from agent_gateway.compat.headers import IndexedHeaders
from agent_gateway.compat.stdlib import holds_callbacks
from agent_gateway.errors import SHOWN
from tests.replicas.test_store import opened
from tests.support import RunningGateway, gateway_process, running_gateway, serving_upstream
from tests.test_responses import BOUND, events, upstream

MODERN = "2026-07-28"
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": MODERN,
}
ENVELOPE = {
    types.PROTOCOL_VERSION_META_KEY: MODERN,
    types.CLIENT_CAPABILITIES_META_KEY: {},
    types.CLIENT_INFO_META_KEY: {"name": "raw", "version": "1"},
}


@asynccontextmanager
async def gateway() -> AsyncIterator[tuple[httpx.AsyncClient, RunningGateway]]:
    async with (
        serving_upstream(upstream()) as url,
        running_gateway({"upstreams": {"up": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        yield http, gw


async def post(
    http: httpx.AsyncClient, gw: RunningGateway | str, method: str, params: dict[str, Any], **meta: Any
) -> httpx.Response:
    params = params | {"_meta": ENVELOPE | meta}
    headers = HEADERS | {"mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    message = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    return await http.post(gw if isinstance(gw, str) else gw.url, json=message, headers=headers)


def media_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").split(";")[0]


async def test_a_call_that_sends_nothing_first_is_answered_with_one_json_body() -> None:
    async with gateway() as (http, gw):
        response = await post(http, gw, "tools/call", {"name": "up__echo", "arguments": {"text": "hi"}})
    assert (response.status_code, media_type(response)) == (200, "application/json")
    assert response.headers["content-length"] == str(len(response.content))
    answer = response.json()
    assert answer["id"] == 7
    assert answer["result"]["content"][0]["text"] == "hi"


async def test_an_error_is_a_json_body_with_the_sdks_status_for_its_code() -> None:
    async with gateway() as (http, gw):
        # Past every check of the entry, refused by the runner: the SDK's status for the code.
        response = await post(http, gw, "tools/call", {"arguments": {}})
    answer = response.json()
    assert answer["error"]["code"] == types.INVALID_PARAMS
    assert response.status_code == ERROR_CODE_HTTP_STATUS[types.INVALID_PARAMS] == 400
    assert media_type(response) == "application/json"


async def test_params_of_the_wrong_type_are_named_by_their_field() -> None:
    async with gateway() as (http, gw):
        token = await post(http, gw, "tools/call", {"name": "up__echo", "arguments": {}}, progressToken=[1])
        arguments = await post(http, gw, "tools/call", {"name": "up__echo", "arguments": "hi"})
        prompt = await post(http, gw, "prompts/get", {"name": "up__brief", "arguments": ["hi"]})
    said = [response.json()["error"] for response in (token, arguments, prompt)]
    assert {error["code"] for error in said} == {types.INVALID_PARAMS}
    assert [error["message"].removeprefix("Invalid request parameters: ") for error in said] == [
        "params._meta.progressToken: should be a valid string or a valid integer",
        "params.arguments: should be a valid dictionary",
        "params.arguments: should be a valid dictionary",
    ]


async def test_a_key_of_the_clients_in_a_fields_path_is_clipped_and_few_fields_are_named() -> None:
    # A prompt's argument names are the client's own: the error repeats 80 characters of one,
    # and names three fields of the four wrong (the client fixes those, then learns the rest).
    key = "k" * 5_000
    arguments = {key: 1, "a": 2, "b": 3, "c": 4}
    async with gateway() as (http, gw):
        response = await post(http, gw, "prompts/get", {"name": "up__brief", "arguments": arguments})
    clipped = f"params.arguments.{key}"[:SHOWN]
    assert response.json()["error"]["message"] == (
        f"Invalid request parameters: {clipped}...: should be a valid string; "
        "params.arguments.a: should be a valid string; params.arguments.b: should be a valid string "
        "(and 1 more)"
    )


async def test_progress_before_the_result_commits_a_stream_with_everything_in_order() -> None:
    async with gateway() as (http, gw):
        call = {"name": "up__steps", "arguments": {"count": 2}}
        response = await post(http, gw, "tools/call", call, progressToken="p1")
    assert media_type(response) == "text/event-stream"
    messages = events(response.text)
    assert [m.get("method", "result") for m in messages] == [
        "notifications/progress",
        "notifications/progress",
        "result",
    ]
    assert [m["params"]["progress"] for m in messages[:2]] == [1, 2]
    assert messages[2]["result"]["content"][0]["text"] == "2 steps"


async def test_a_call_silent_past_the_ping_interval_is_answered_on_a_pinged_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A proxy's idle-read timeout must not cut a long call: past the interval the answer
    # becomes a stream and is pinged, as the SDK's own entry does.
    monkeypatch.setattr(exchange, "PING_INTERVAL", 0.4)
    async with gateway() as (http, gw):
        response = await post(http, gw, "tools/call", {"name": "up__slow", "arguments": {"seconds": 1.2}})
    assert media_type(response) == "text/event-stream"
    assert response.text.startswith(": ping\r\n\r\n")
    [result] = events(response.text)
    assert result["result"]["content"][0]["text"] == "slept"


async def test_what_is_not_one_plain_request_is_answered_by_the_sdks_entry() -> None:
    async with gateway() as (http, gw):
        notification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        acknowledged = await http.post(gw.url, json=notification, headers=HEADERS)
        batch = await http.post(gw.url, json=[notification], headers=HEADERS)
        unparsable = await http.post(gw.url, content=b"{", headers=HEADERS)
        listed = await post(http, gw, "tools/list", {})
    assert acknowledged.status_code == 202
    assert (batch.status_code, batch.json()["error"]["code"]) == (400, types.INVALID_REQUEST)
    assert (unparsable.status_code, unparsable.json()["error"]["code"]) == (400, types.PARSE_ERROR)
    assert "up__echo" in {tool["name"] for tool in listed.json()["result"]["tools"]}


async def test_a_post_that_does_not_accept_its_answers_type_gets_406_saying_so() -> None:
    # The SDK's modern entry answered an empty 406, where a handshake-era client is told why.
    async with gateway() as (http, gw):
        message = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": ENVELOPE}}
        html_only = await http.post(gw.url, json=message, headers=HEADERS | {"accept": "text/html"})
        no_stream = await http.post(gw.url, json=message, headers=HEADERS | {"accept": "application/json"})
    for refused in (html_only, no_stream):
        assert (refused.status_code, media_type(refused)) == (406, "application/json")
        assert refused.json()["error"] == {
            "code": types.INVALID_REQUEST,
            "message": "Not Acceptable: Client must accept both application/json and text/event-stream",
        }


def test_indexed_headers_answer_every_lookup_as_starlettes_headers_do() -> None:
    raw = [
        (b"host", b"gw:8000"),
        (b"mcp-method", b"tools/call"),
        (b"x-twice", b"first"),
        (b"accept", b"application/json"),
        (b"x-twice", b"second"),
    ]  # lower-case, as ASGI servers give them
    scope = {"type": "http", "headers": raw}
    indexed, plain = IndexedHeaders(scope), Headers(scope=scope)
    names = ["host", "HOST", "Mcp-Method", "x-twice", "accept", "absent"]
    assert [indexed.get(n) for n in names] == [plain.get(n) for n in names]
    assert [n in indexed for n in names] == [n in plain for n in names]
    assert dict(indexed) == dict(plain) == indexed.first
    assert (indexed.items(), indexed.getlist("x-twice")) == (plain.items(), plain.getlist("x-twice"))
    with pytest.raises(KeyError):
        indexed["absent"]
    assert indexed.repeated
    assert not IndexedHeaders({"type": "http", "headers": raw[:2]}).repeated
    assert IndexedHeaders({"type": "http", "headers": [(b"a", b"1"), (b"A", b"2")]}).repeated


@pytest.mark.parametrize("header", ["mcp-method", "mcp-protocol-version"])
async def test_a_routing_header_given_twice_is_refused_and_reaches_no_upstream(header: str) -> None:
    async with gateway() as (http, gw):
        params = {"name": "up__echo", "arguments": {"text": "hi"}, "_meta": ENVELOPE}
        message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
        headers = [*(HEADERS | {"mcp-method": "tools/call", "mcp-name": "up__echo"}).items()]
        twice = [*headers, (header, dict(headers)[header])]
        refused = await http.post(gw.url, content=json.dumps(message), headers=twice)
        answered = await http.post(gw.url, content=json.dumps(message), headers=headers)
    assert refused.status_code == 400
    assert header in refused.json()["error"]["message"].lower()
    assert answered.json()["result"]["content"][0]["text"] == "hi"


@pytest.mark.parametrize("refused", [{"accept": "text/html"}, {"content-type": "text/plain"}])
async def test_a_notification_the_checks_refuse_is_not_counted_as_a_refused_request(
    refused: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    # Only a request (with an id) the SDK entry's checks refuse is recorded as a refused call;
    # a notification is no call, refused before its body is read or after.
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 1, "_meta": ENVELOPE},
    }
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "up__echo", "_meta": ENVELOPE},
    }
    caplog.set_level(logging.WARNING, logger="agent_gateway.refusals")
    async with gateway() as (http, gw):
        for message, method in ((note, "notifications/cancelled"), (call, "tools/call")):
            headers = HEADERS | {"mcp-method": method, "mcp-name": "up__echo"} | refused
            answer = await http.post(gw.url, json=message, headers=headers)
            assert answer.status_code in (400, 406)
    counted = [r.getMessage() for r in caplog.records if "refused a modern-era request" in r.getMessage()]
    assert len(counted) == 1  # the call's


def answers_counted(scraped: str, form: str) -> float:
    """How many modern-era answers of ``form`` the gateway's metric counted."""
    family = "agent_gateway_http_answers_total{"
    lines = [line for line in scraped.splitlines() if line.startswith(family) and 'mcp_era="modern"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if f'form="{form}"' in line)


async def test_each_answer_is_counted_by_its_form(tmp_path: Path) -> None:
    async with (
        serving_upstream(upstream()) as url,
        gateway_process({"upstreams": {"up": {"url": url}}}, tmp_path) as base,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        await post(http, f"{base}/mcp", "tools/call", {"name": "up__echo", "arguments": {"text": "hi"}})
        steps = {"name": "up__steps", "arguments": {"count": 1}}
        await post(http, f"{base}/mcp", "tools/call", steps, progressToken="p")
        scraped = (await http.get(f"{base}/metrics")).text
    assert (answers_counted(scraped, "json"), answers_counted(scraped, "stream")) == (1, 1)


async def test_a_served_requests_connection_is_unwound_when_it_holds_something_and_only_then() -> None:
    """``exchange._served`` runs the SDK's runner as ``serve_one`` does, but unwinds the
    per-request connection (shielded, bounded) only when something was pushed on it."""
    unwound: list[str] = []

    async def pushing(ctx: Any, params: types.RequestParams) -> dict[str, Any]:
        if ctx.method == "test/push":  # what FastMCP's logging/setLevel does on a connection
            connection.exit_stack.callback(unwound.append, "pushed")
        return {}

    server: Server[Any] = Server("unwinding")
    for method in ("test/push", "test/plain"):
        server.add_request_handler(method, types.RequestParams, pushing)
    for method, pushed in (("test/plain", []), ("test/push", ["pushed"])):
        connection = Connection.from_envelope(LATEST_MODERN_VERSION, None, None)
        context = exchange.ExchangeContext(
            transport=TransportContext(kind="streamable-http", can_send_request=False),
            request_id=1,
            message_metadata=None,
        )
        message = types.JSONRPCRequest(jsonrpc="2.0", id=1, method=method, params=None)
        result = await exchange._served(ServerRunner(server, connection, None), context, message)  # pyright: ignore[reportPrivateUsage]
        assert result["resultType"] == "complete"
        assert unwound == pushed
        assert not holds_callbacks(connection.exit_stack)


@pytest.mark.parametrize("era", ["modern", "handshake"])
async def test_nan_and_infinity_are_refused_as_the_json_they_are_not(era: str) -> None:
    # Python's parser takes NaN and Infinity, which JSON does not have; the value reached the
    # upstream as null, a call the client never made.
    seen: list[object] = []
    server = FastMCP("numbers")

    @server.tool
    def show(value: float | None = None) -> str:
        seen.append(value)
        return repr(value)

    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"n": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        headers = HEADERS | {"mcp-method": "tools/call", "mcp-name": "n__show"}
        if era == "handshake":
            accept = {"accept": HEADERS["accept"], "content-type": HEADERS["content-type"]}
            headers = accept | await opened(http, gw.url)
        params = {"name": "n__show", "arguments": {"value": "__NAN__"}}
        if era == "modern":
            params["_meta"] = ENVELOPE
        for constant in ("NaN", "Infinity", "-Infinity"):
            body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
            answer = await http.post(gw.url, content=body.replace('"__NAN__"', constant), headers=headers)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == types.PARSE_ERROR
            assert "NaN or Infinity" in answer.json()["error"]["message"]
    assert seen == []
