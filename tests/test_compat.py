"""The seam with third-party internals (``agent_gateway.compat``): each private member the
gateway uses still exists, with the shape it is used with.

An upgrade that renames, moves or reshapes one fails here, naming the member and the
library, instead of failing silently at run time (a handshake-era answer back on SSE, a
memory that grows, a provider built without the gateway's connection pool).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import logging
import os
import pkgutil
import sqlite3
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from types import CodeType
from typing import Any

import httpx2
import mcp_types as types
import pytest
import uvicorn
from fastmcp import FastMCP
from fastmcp.server.auth import JWTVerifier
from fastmcp.server.dependencies import get_context
from fastmcp.server.event_store import EventStore as InMemoryEventStore
from fastmcp.server.http import FastMCPStreamableHTTPSessionManager
from fastmcp.server.session_scoped_event_store import SessionScopedEventStore
from httpx2._exceptions import request_context
from httpx2._sse import _SSEParser  # pyright: ignore[reportPrivateUsage]
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from mcp import Client
from mcp.client import session as client_session
from mcp.client import sse, streamable_http
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.runner import ServerRunner, serve_connection
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import GET_STREAM_KEY, LAST_EVENT_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared._httpx_utils import sse_within_origin, stream_within_origin
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp_types import JSONRPCResponse, jsonrpc_message_adapter
from mcp_types import methods as mcp_methods
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import ValidationError
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

import agent_gateway
from agent_gateway import compat
from agent_gateway.compat import exchange, lane
from agent_gateway.compat import fastmcp as fastmcp_compat
from agent_gateway.compat import httpx2 as httpx2_compat
from agent_gateway.compat import langchain as langchain_compat
from agent_gateway.compat import langgraph as langgraph_compat
from agent_gateway.compat import mcp as mcp_compat
from agent_gateway.compat.capabilities import told_per_request
from agent_gateway.compat.deferred import DeferredStreamTransport
from agent_gateway.compat.opentelemetry import restatus
from agent_gateway.compat.replay import ReplayFromStore
from agent_gateway.compat.resumed import resumed_client
from agent_gateway.compat.stdlib import holds_callbacks
from agent_gateway.store.events import session_of
from tests.support import serving_upstream

SRC = Path(compat.__file__).resolve().parent.parent


def parameters(function: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


def assigned_in_init(cls: type, attribute: str) -> bool:
    """Whether ``cls`` (or a base) declares ``attribute`` or its ``__init__`` assigns it."""
    for klass in cls.__mro__:
        if attribute in inspect.get_annotations(klass):
            return True
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        tree = ast.parse(inspect.getsource(init).strip().replace("\n    ", "\n"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == attribute and isinstance(node.ctx, ast.Store):
                return True
    return False


# -- mcp -----------------------------------------------------------------------------------

# Each private method DeferredStreamTransport calls or overrides, with the parameters it passes.
TRANSPORT_METHODS = {
    "_handle_post_request": ["scope", "request", "receive", "send"],
    "_validate_request_headers": ["request", "send"],
    "_create_error_response": ["error_message", "status_code", "error_code"],
    "_check_content_type": ["request"],
    "_create_session_message": ["message", "request", "request_id", "protocol_version"],
    "_clean_up_memory_streams": ["request_id"],
    "_create_json_response": ["response_message"],
    "_run_sse_writer": ["request_id", "sse_stream_writer", "request_stream_reader", "priming_event"],
    "_replay_events": ["last_event_id", "request", "send"],  # compat/replay.py
    "_handle_get_request": ["request", "send"],
}
TRANSPORT_STATE = ["_read_stream_writer", "_event_store", "_request_streams", "_sse_stream_writers"]


@pytest.mark.parametrize("method", TRANSPORT_METHODS)
def test_the_sdk_transport_has_each_private_method_deferred_responses_use(method: str) -> None:
    function = getattr(StreamableHTTPServerTransport, method, None)
    assert callable(function), f"mcp: StreamableHTTPServerTransport.{method} is gone (compat/deferred.py)"
    expected = TRANSPORT_METHODS[method]
    assert parameters(function)[: len(expected)] == expected, (
        f"mcp: StreamableHTTPServerTransport.{method} takes {parameters(function)} now, "
        f"compat/deferred.py passes {expected}"
    )


@pytest.mark.parametrize("attribute", TRANSPORT_STATE)
def test_the_sdk_transport_keeps_each_piece_of_state_deferred_responses_read(attribute: str) -> None:
    assert assigned_in_init(StreamableHTTPServerTransport, attribute), (
        f"mcp: StreamableHTTPServerTransport no longer sets self.{attribute} (compat/deferred.py)"
    )


# Each private member of the SDK's dispatcher the lane uses (compat/lane.py).
DISPATCHER_METHODS = {
    "_write_result": ["request_id", "result"],
    "_write_error": ["request_id", "error"],
    "_handle_request": ["req", "dctx", "scope", "on_request"],
}
DISPATCHER_STATE = ["_in_flight", "_transport_builder", "_running"]


@pytest.mark.parametrize("method", DISPATCHER_METHODS)
def test_the_sdk_dispatcher_has_each_private_method_the_lane_uses(method: str) -> None:
    function = getattr(JSONRPCDispatcher, method, None)
    assert callable(function), f"mcp: JSONRPCDispatcher.{method} is gone (compat/lane.py)"
    assert parameters(function) == DISPATCHER_METHODS[method], (
        f"mcp: JSONRPCDispatcher.{method} takes {parameters(function)} now, compat/lane.py "
        f"reads it as {DISPATCHER_METHODS[method]}"
    )


@pytest.mark.parametrize("attribute", DISPATCHER_STATE)
def test_the_sdk_dispatcher_keeps_each_piece_of_state_the_lane_reads(attribute: str) -> None:
    assert assigned_in_init(JSONRPCDispatcher, attribute), (
        f"mcp: JSONRPCDispatcher no longer sets self.{attribute} (compat/lane.py)"
    )


def test_the_lane_registers_a_request_in_flight_as_the_dispatcher_does() -> None:
    # The lane re-does _dispatch_request's bookkeeping: an _InFlight(scope, dctx) under the
    # coerced id, a dispatch context built from these fields, popped when the handler ends.
    dispatch = inspect.getsource(JSONRPCDispatcher._dispatch_request)  # pyright: ignore[reportPrivateUsage]
    assert "self._in_flight[coerce_request_id(req.id)] = _InFlight(scope=scope, dctx=dctx)" in dispatch
    handle = inspect.getsource(JSONRPCDispatcher._handle_request)  # pyright: ignore[reportPrivateUsage]
    assert "dctx.close()" in handle
    assert "del self._in_flight[key]" in handle
    assert "error = ErrorData(code=0, message=str(e))" in handle, "the dispatcher's catch-all changed"
    fields = [f.name for f in dataclasses.fields(lane._JSONRPCDispatchContext)]  # pyright: ignore[reportPrivateUsage]
    assert fields == [
        "transport",
        "_dispatcher",
        "_request_id",
        "message_metadata",
        "_progress_token",
        "_closed",  # InlineContext reads it, as notify does, before committing a stream
        "cancel_requested",
    ]
    assert isinstance(lane._JSONRPCDispatchContext.can_send_request, property)  # pyright: ignore[reportPrivateUsage]
    assert [f.name for f in dataclasses.fields(lane._InFlight)] == ["scope", "dctx"]  # pyright: ignore[reportPrivateUsage]
    assert [f.name for f in dataclasses.fields(ServerRunner)][:3] == [
        "server",
        "connection",
        "lifespan_state",
    ]
    cancelled = inspect.getsource(JSONRPCDispatcher._dispatch_notification)  # pyright: ignore[reportPrivateUsage]
    assert "self._in_flight.get(coerce_request_id(rid))" in cancelled, (
        "a client's cancel finds calls elsewhere"
    )


def test_the_sdk_modern_entry_has_each_private_member_the_exchange_uses() -> None:
    sdk = exchange.sdk
    assert parameters(sdk.handle_modern_request) == [
        "app",
        "security_settings",
        "json_response",
        "lifespan_state",
        "scope",
        "receive",
        "send",
    ], "mcp: handle_modern_request changed: compat/exchange.py hands it what it does not serve"
    rejection = sdk._mcp_param_rejection  # pyright: ignore[reportPrivateUsage]
    assert parameters(rejection) == ["app", "request", "req", "verdict", "lifespan_state"]
    assert isinstance(exchange.PING_INTERVAL, float)
    assert (b"content-type", b"text/event-stream") in exchange._SSE_HEADERS  # pyright: ignore[reportPrivateUsage]
    ping = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params={"progress": 1})
    assert sdk._sse_event(ping).startswith(b"event: message\r\ndata: {")  # pyright: ignore[reportPrivateUsage]
    context = sdk._SingleExchangeDispatchContext  # pyright: ignore[reportPrivateUsage]
    assert [f.name for f in dataclasses.fields(context)] == [
        "transport",
        "request_id",
        "message_metadata",
        "progress_token",
        "sink",
        "cancel_requested",
        "can_send_request",
    ], "mcp: the modern entry's dispatch context changed (compat/exchange.ExchangeContext)"
    # The entry's own order of checks, which ModernLane._admitted repeats.
    entry = inspect.getsource(sdk.handle_modern_request)
    order = [
        "security.validate_request",
        "check_accept_headers",
        "json.loads",
        "_is_notification_shaped",
        "JSONRPCRequest.model_validate",
        '"subscriptions/listen"',
        "find_duplicated_routing_header",
        "classify_inbound_request",
        "_mcp_param_rejection",
        "Connection.from_envelope",
        "serve_one",
    ]
    assert [entry.find(step) for step in order] == sorted(entry.find(step) for step in order)
    assert -1 not in [entry.find(step) for step in order], "a check of the modern entry is gone"


def test_the_sdk_transport_replays_a_get_with_last_event_id_read_from_its_scopes_headers() -> None:
    # compat/replay.py drops the header from the scope to serve the GET as one without it.
    assert LAST_EVENT_ID_HEADER == "last-event-id"
    get = inspect.getsource(StreamableHTTPServerTransport._handle_get_request)  # pyright: ignore[reportPrivateUsage]
    assert "if last_event_id := request.headers.get(LAST_EVENT_ID_HEADER):" in get
    assert "await self._replay_events(last_event_id, request, send)" in get
    assert issubclass(DeferredStreamTransport, ReplayFromStore)


def test_the_session_manager_routes_by_era_through_the_app_it_was_made_with() -> None:
    init = inspect.getsource(StreamableHTTPSessionManager.__init__)
    assert "self.asgi_app = RequestBodyLimitMiddleware(self._handle_request, max_request_body_size)" in init
    assert assigned_in_init(StreamableHTTPSessionManager, "max_request_body_size")
    route = inspect.getsource(StreamableHTTPSessionManager._handle_request)  # pyright: ignore[reportPrivateUsage]
    assert "pv not in HANDSHAKE_PROTOCOL_VERSIONS" in route
    assert "await handle_modern_request(" in route
    handle = inspect.getsource(StreamableHTTPSessionManager.handle_request)
    assert "await self.asgi_app(scope, receive, send)" in handle


def test_the_client_session_keeps_the_output_schemas_its_result_check_reads() -> None:
    assert assigned_in_init(client_session.ClientSession, "_tool_output_schemas")
    check = inspect.getsource(client_session.ClientSession.validate_tool_result)
    assert "self._tool_output_schemas" in check, "mcp: validate_tool_result reads its schemas elsewhere"


def test_fastmcps_session_manager_admits_a_session_by_one_overridable_method() -> None:
    admit = getattr(FastMCPStreamableHTTPSessionManager, "_admit_session", None)
    assert callable(admit), "fastmcp/mcp: the session manager's _admit_session is gone (compat/deferred.py)"
    assert parameters(admit) == ["requestor"]


# Each private member of the SDK's (and FastMCP's) session manager AdoptingSessionManager uses.
MANAGER_METHODS = {
    "_handle_stateful_request": ["scope", "receive", "send"],
    "_discard_session": ["session_id", "transport"],
    "_admit_session": ["requestor"],
}
MANAGER_STATE = [
    "_server_instances",
    "_session_owners",
    "_session_creation_lock",
    "_task_group",
    "_lifespan_state",
    "_shared_event_store",
]


@pytest.mark.parametrize("method", MANAGER_METHODS)
def test_the_session_manager_has_each_private_method_adoption_uses(method: str) -> None:
    function = getattr(FastMCPStreamableHTTPSessionManager, method, None)
    assert callable(function), f"mcp: the session manager's {method} is gone (compat/adoption.py)"
    assert parameters(function) == MANAGER_METHODS[method], (
        f"mcp: {method} takes {parameters(function)} now, compat/adoption.py passes {MANAGER_METHODS[method]}"
    )


@pytest.mark.parametrize("attribute", MANAGER_STATE)
def test_the_session_manager_keeps_each_piece_of_state_adoption_reads(attribute: str) -> None:
    assert assigned_in_init(FastMCPStreamableHTTPSessionManager, attribute), (
        f"mcp/fastmcp: the session manager no longer sets self.{attribute} (compat/adoption.py, compat/deferred.py, compat/idle.py)"
    )


# Each piece of a transport's state room is made by (compat/idle.py).
IDLE_STATE = ["idle_scope", "_requests_in_flight", "_request_streams"]


@pytest.mark.parametrize("attribute", IDLE_STATE)
def test_the_sdk_transport_keeps_each_piece_of_state_room_is_made_by(attribute: str) -> None:
    assert assigned_in_init(StreamableHTTPServerTransport, attribute), (
        f"mcp: StreamableHTTPServerTransport no longer sets self.{attribute} (compat/idle.py)"
    )
    # An open GET stream counts as a request in flight, as idle.listening reads it.
    assert "self._requests_in_flight += 1" in inspect.getsource(StreamableHTTPServerTransport.handle_request)


def test_a_session_scoped_stream_id_is_what_the_relay_looks_its_stream_up_by() -> None:
    # The relay finds a session's notification stream by the id FastMCP's scoped store
    # gives it; the transport keeps that stream under GET_STREAM_KEY in _request_streams.
    scoped = SessionScopedEventStore(InMemoryEventStore(), session_id="s-1")
    assert scoped._scope_stream_id(GET_STREAM_KEY) == "3:s-1:_GET_stream"  # pyright: ignore[reportPrivateUsage]
    # store/events.session_of reads the session back out of it (its streams go with its DELETE).
    assert session_of(scoped._scope_stream_id("7:a:b")) == "s-1"  # pyright: ignore[reportPrivateUsage]
    assert session_of("not-scoped") is None
    assert "_request_streams" in TRANSPORT_STATE


def test_an_adopted_connection_is_built_as_the_sdks_loop_builds_one() -> None:
    assert parameters(mcp_compat.Connection.__init__)[:4] == [
        "outbound",
        "protocol_version",
        "session_id",
        "client_params",
    ]
    assert parameters(serve_connection)[:4] == ["server", "dispatcher", "connection", "lifespan_state"]
    assert "idle_scope" in inspect.getsource(StreamableHTTPServerTransport.connect)


def test_a_server_session_keeps_its_connection_as_connection_of_reads_it() -> None:
    assert assigned_in_init(ServerSession, "_connection"), "mcp: ServerSession._connection is gone"
    connection = mcp_compat.Connection
    assert assigned_in_init(connection, "state")
    assert callable(connection.notify)
    assert callable(connection.send_resource_updated)


def test_the_private_sdk_names_compat_imports_are_what_they_were() -> None:
    assert isinstance(mcp_compat.MCP_DEFAULT_TIMEOUT, float)
    assert isinstance(mcp_compat.MCP_DEFAULT_SSE_READ_TIMEOUT, float)
    assert parameters(mcp_compat.create_mcp_http_client)[:3] == ["headers", "timeout", "auth"]
    assert getattr(mcp_compat.TransportStreams, "__origin__", None) is tuple


def test_the_sdk_http_client_transport_is_built_as_http_session_builds_it() -> None:
    # compat/resumed.http_session is the SDK's streamable_http_client with the session id set
    # first: the same transport, the same two tasks, the same private stream helpers.
    transport = streamable_http.StreamableHTTPTransport
    assert parameters(transport.__init__)[:2] == ["url", "max_sse_event_size"]
    assert assigned_in_init(transport, "session_id")
    expected = [
        "client",
        "write_stream_reader",
        "read_stream_writer",
        "write_stream",
        "start_get_stream",
        "tg",
    ]
    assert parameters(transport.post_writer) == expected
    assert parameters(transport.handle_get_stream) == ["client", "read_stream_writer"]
    assert parameters(transport.terminate_session) == ["client"]
    source = inspect.getsource(streamable_http.streamable_http_client)
    assert "create_context_streams[SessionMessage | Exception](0)" in source
    assert "await resync_tracer()" in source
    assert "tg.start_soon(transport.handle_get_stream, client, read_stream_writer)" in source


def test_the_sdk_http_transport_members_bounded_transport_overrides_are_what_they_were() -> None:
    # compat/http_streams.BoundedTransport: what it overrides, reads and calls of the SDK's.
    transport = streamable_http.StreamableHTTPTransport
    private = {
        "_handle_post_request": ["ctx"],
        "_handle_reconnection": ["ctx", "last_event_id", "retry_interval_ms", "attempt"],
        "_resolve_abandoned_request": ["read_stream_writer", "request_id", "message", "code"],
        "_handle_sse_event": ["sse", "read_stream_writer", "original_request_id", "resumption_callback"],
        "_handle_sse_response": ["response", "ctx"],
    }
    for name, expected in private.items():
        assert parameters(getattr(transport, name)) == expected, (
            f"mcp: {name} changed (compat/http_streams.py)"
        )
    # Without the request's id, a message it cannot read is reported to the session, not
    # made the request's failure; with it, only an answer's id is replaced.
    handled = inspect.getsource(transport._handle_sse_event)  # pyright: ignore[reportPrivateUsage]
    assert "if original_request_id is not None:" in handled
    assert "await read_stream_writer.send(exc)" in handled
    assert assigned_in_init(transport, "_in_flight_posts")
    assert [f.name for f in dataclasses.fields(streamable_http._InFlightPost)] == ["scope", "modern"]  # pyright: ignore[reportPrivateUsage]
    assert {"session_message", "read_stream_writer"} <= {
        f.name for f in dataclasses.fields(streamable_http.RequestContext)
    }
    # Resumed by recursion through self (each depth is counted), and every stream reopened
    # through the module's sse_within_origin (replaced to floor its events' retry).
    reconnect = transport._handle_reconnection  # pyright: ignore[reportPrivateUsage]
    assert "self._handle_reconnection(" in inspect.getsource(reconnect)
    for method in (reconnect, transport.handle_get_stream):
        assert "sse_within_origin" in method.__code__.co_names, (
            f"mcp: {method.__name__} no longer opens its stream through the module's sse_within_origin"
        )
    # A POST's answer is read through the module's EventSource (replaced to bound its noise),
    # in the task that called _handle_sse_response, and its SSEError fails the request.
    answered = inspect.getsource(transport._handle_sse_response)  # pyright: ignore[reportPrivateUsage]
    assert "EventSource(response, max_event_size=self.max_sse_event_size)" in answered
    assert "except httpx2.SSEError as exc:" in answered
    source = inspect.getsource(transport.post_writer)
    assert "self._consume_modern_cancellation(session_message)" in source
    assert "await handle_request_async()" in source, "mcp: a notification is no longer POSTed before the next"


async def test_a_resumed_client_adopts_its_handshake_and_sends_nothing_to_enter() -> None:
    # Client._build_session is the one place the recorded InitializeResult is installed.
    assert parameters(Client._build_session) == ["exit_stack"]  # pyright: ignore[reportPrivateUsage]
    installed: list[Any] = []
    server = fastmcp_compat.lowlevel_server(FastMCP("x"))
    result = types.InitializeResult(
        protocol_version="2025-11-25",
        capabilities=types.ServerCapabilities(),
        server_info=types.Implementation(name="recorded", version="1"),
    )
    client = resumed_client(result, server=server, message_handler=None)
    async with client:
        installed.append(client.session.initialize_result)
        assert client.server_info is not None
        assert client.server_info.name == "recorded"  # the record's, not the server's ("x")
    assert installed == [result]


def test_call_in_rounds_drives_rounds_as_the_clients_own_call_tool_does() -> None:
    # compat/mcp.call_in_rounds: Client.call_tool's loop around a tools/call sent elsewhere.
    assert parameters(Client._drive_input_required) == ["first", "retry"]  # pyright: ignore[reportPrivateUsage]
    assert parameters(Client._relist_tool) == ["name"]  # pyright: ignore[reportPrivateUsage]
    assert "read_timeout_seconds" in Client.__dataclass_fields__
    source = inspect.getsource(Client.call_tool)
    for step in ("self._drive_input_required(", "self._relist_tool(name)", "HEADER_MISMATCH"):
        assert step in source, f"mcp: Client.call_tool no longer does {step} (compat/mcp.call_in_rounds)"


def test_the_sdk_client_parses_through_its_modules_adapter_which_lean_parsing_replaces() -> None:
    transport = streamable_http.StreamableHTTPTransport
    for method in (transport._handle_json_response, transport._handle_sse_event):  # pyright: ignore[reportPrivateUsage]
        assert "jsonrpc_message_adapter" in method.__code__.co_names, (
            f"mcp: {method.__name__} no longer reads the module's jsonrpc_message_adapter (compat/mcp.py)"
        )
    mcp_compat.lean_client_parsing()
    adapter = vars(streamable_http)["jsonrpc_message_adapter"]
    assert isinstance(adapter.validate_json(b'{"jsonrpc":"2.0","id":1,"result":{}}'), JSONRPCResponse)


def names_read(code: CodeType) -> set[str]:
    """The global and attribute names ``code`` and the functions nested in it read."""
    nested = (const for const in code.co_consts if isinstance(const, CodeType))
    return set(code.co_names).union(*(names_read(inner) for inner in nested))


def test_the_sdk_sse_client_reads_the_module_globals_compat_replaces() -> None:
    # compat/sse.py replaces mcp.client.sse's globals, read at each use: the stream's opener
    # (its event bound), the POST (its failure told), the parser (types' adapter).
    opened = inspect.unwrap(sse.sse_client)
    read = names_read(opened.__code__)
    for name in ("sse_within_origin", "request_within_origin", "types", "jsonrpc_message_adapter"):
        assert name in read, f"mcp: sse_client no longer reads the module's {name} (compat/sse.py)"
    assert "types" in vars(sse), "mcp: sse has no module global types (compat/sse.py)"
    assert "max_event_size" in inspect.signature(sse_within_origin).parameters, (
        "mcp: sse_within_origin takes no max_event_size (compat/sse.py)"
    )
    assert parameters(stream_within_origin)[:3] == ["client", "method", "url"], (
        "mcp: stream_within_origin's parameters changed (compat/sse.py)"
    )
    # The writer stops at its first failed POST, told by raising (compat/sse.py tells the
    # gateway first).
    source = inspect.getsource(opened)
    assert "response.raise_for_status()" in source
    assert 'logger.exception("Error in post_writer")' in source
    # A POST's answer, read to a bound there, is not read again here: its status alone.
    assert "response = await request_within_origin(" in source
    reads = ("response.content", "response.text", "response.json(", "response.aread(")
    assert not any(read in source for read in reads), "mcp: sse_client reads a POST's answer (compat/sse.py)"
    # An event parsed into the message it returns, or what it raises logged and told the session.
    assert "types.jsonrpc_message_adapter.validate_json(sse.data, by_name=False)" in source
    assert 'logger.exception("Error parsing server message")' in source


def test_the_sdk_client_checks_results_through_the_module_function_lean_checks_replace() -> None:
    send = client_session.ClientSession.send_request
    assert client_session._methods is mcp_methods, "mcp: ClientSession no longer reads mcp_types.methods"  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]
    assert "validate_server_result" in send.__code__.co_names, (
        "mcp: ClientSession.send_request no longer calls methods.validate_server_result (compat/mcp.py)"
    )
    assert parameters(mcp_methods._check_known_version) == ["version"]  # pyright: ignore[reportPrivateUsage]
    assert parameters(mcp_methods._adapter) == ["target"]  # pyright: ignore[reportPrivateUsage]
    mcp_compat.lean_result_checks()
    assert mcp_methods.validate_server_result is mcp_compat._validate_server_result  # pyright: ignore[reportPrivateUsage]


async def test_a_requests_own_capabilities_outlast_the_sessions_modern_stamp() -> None:
    server = FastMCP("x")
    async with serving_upstream(server) as url, Client(url, mode="auto") as client:
        told_per_request(client.session)
        caps = types.CLIENT_CAPABILITIES_META_KEY
        own = {"sampling": {}}
        mine: dict[str, Any] = {"method": "tools/call", "params": {"name": "t", "_meta": {caps: own}}}
        theirs: dict[str, Any] = {"method": "tools/call", "params": {"name": "t"}}
        mcp_compat.stamp(client.session, mine)
        mcp_compat.stamp(client.session, theirs)
    assert mine["params"]["_meta"][caps] == own
    assert "sampling" not in theirs["params"]["_meta"][caps]  # the session's own: no callbacks


async def test_stamp_gives_what_the_session_adds_to_a_request_in_the_modern_era() -> None:
    assert assigned_in_init(client_session.ClientSession, "_stamp"), "mcp: ClientSession._stamp is gone"
    server = FastMCP("x")

    @server.tool
    def echo(text: str) -> str:
        return text

    async with serving_upstream(server) as url, Client(url, mode="auto") as client:
        data: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}
        headers = mcp_compat.stamp(client.session, data)
        version = client.protocol_version
    assert headers["mcp-protocol-version"] == version
    assert (headers["mcp-method"], headers["mcp-name"]) == ("tools/call", "echo")
    meta = data["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == version
    assert {"io.modelcontextprotocol/clientInfo", "io.modelcontextprotocol/clientCapabilities"} <= set(meta)


def test_the_client_span_of_a_forwarded_request_is_the_sdks_own() -> None:
    # The dispatcher's span for a request it sends: otel_span, its name and attributes.
    source = inspect.getsource(JSONRPCDispatcher.send_raw_request)
    assert "otel_span(" in source, "mcp: the dispatcher no longer makes its client span with otel_span"
    assert 'f"MCP send {method}' in source, "mcp: the client span's name changed"
    assert '"mcp.method.name": method, "jsonrpc.request.id": str(request_id)' in source
    assert "inject_trace_context(out_meta)" in source
    with mcp_compat.otel_client_span("tools/call", "echo", 7) as span:
        assert span is not None


@pytest.mark.parametrize(
    ("method", "version", "data"),
    [
        (
            "tools/call",
            "2025-11-25",
            {"content": [{"type": "text", "text": "x"}], "structuredContent": {"a": 1}},
        ),
        ("tools/call", "2026-07-28", {"content": [{"type": "text", "text": "x"}], "isError": True}),
        ("tools/list", "2025-11-25", {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}),
        ("tools/list", "2025-11-25", {"tools": [{"name": "t"}]}),  # no inputSchema: refused
        ("tools/call", "2025-11-25", {"content": "x"}),  # content not a list: refused
        ("tools/call", "1999-01-01", {"content": []}),  # unknown version
        ("no/such", "2025-11-25", {}),  # unknown method
    ],
)
def test_lean_result_checks_accept_and_refuse_what_the_sdks_own_check_does(
    method: str, version: str, data: dict[str, Any]
) -> None:
    def outcome(check: Callable[[], object]) -> type[BaseException] | None:
        try:
            check()
        except (ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
            return type(exc)
        return None

    # The SDK's validate_server_result is serialize_server_result with its dump discarded.
    expected = outcome(lambda: mcp_methods.serialize_server_result(method, version, data))
    assert outcome(lambda: mcp_compat._validate_server_result(method, version, data)) is expected  # pyright: ignore[reportPrivateUsage]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "_meta": {"k": 1}}}',
        b'{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p", "progress": 0.5}}',
        b'{"jsonrpc": "2.0", "id": "a", "result": {"content": [{"type": "text", "text": "\\u00e9\\n\xc3\xa9"}]}}',
        b'{"jsonrpc": "2.0", "id": 123456789012345678901234567890, "result": {}}',
        b'{"jsonrpc": "2.0", "id": 2, "error": {"code": -32601, "message": "no", "data": [1.5, null]}}',
    ],
)
def test_parse_message_reads_what_pydantic_reads(raw: bytes) -> None:
    expected = jsonrpc_message_adapter.validate_json(raw, by_name=False)
    assert mcp_compat.parse_message(raw) == expected
    assert mcp_compat.parse_message(raw.decode()) == expected


@pytest.mark.parametrize(
    "raw", [b"{not json", b'{"jsonrpc": "2.0", "id": 1, "result": "\xff"}', b"[]", b"{}"]
)
def test_parse_message_refuses_what_pydantic_refuses(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        jsonrpc_message_adapter.validate_json(raw, by_name=False)
    with pytest.raises(ValidationError):
        mcp_compat.parse_message(raw)


# -- fastmcp -------------------------------------------------------------------------------


def test_fastmcp_keeps_its_low_level_server() -> None:
    lowlevel = fastmcp_compat.lowlevel_server(FastMCP("x"))
    assert isinstance(lowlevel, Server)
    # The public low-level API the gateway then uses (mcp's, not FastMCP's).
    assert isinstance(lowlevel.middleware, list)
    assert lowlevel.get_request_handler("tools/call") is not None
    assert hasattr(lowlevel, "get_tool_input_schema")


def test_fastmcps_jwt_verifier_fetches_its_jwks_through_the_one_method_bounded_jwks_overrides() -> None:
    # compat/fastmcp.BoundedJwks replaces _fetch_jwks; its caller turns a ValueError into a refusal.
    verifier = JWTVerifier
    assert parameters(verifier._fetch_jwks) == [], "fastmcp: _fetch_jwks takes arguments now"  # pyright: ignore[reportPrivateUsage]
    refresh = inspect.getsource(verifier._refresh_jwks_key)  # pyright: ignore[reportPrivateUsage]
    assert "await self._fetch_jwks()" in refresh, "fastmcp: the JWKS is no longer fetched by _fetch_jwks"
    assert "except (JoseError, TypeError, KeyError, ValueError)" in refresh, (
        "fastmcp: a ValueError is no refusal now"
    )
    assert "jwks_uri" in inspect.signature(verifier.__init__).parameters
    # Its keys kept past their hour while the provider is down, and fetched at start-up: the
    # method a token's key comes from, the cache it reads, the lock and the retry interval.
    assert parameters(verifier._get_jwks_key) == ["kid"], "fastmcp: _get_jwks_key changed its arguments"  # pyright: ignore[reportPrivateUsage]
    assert parameters(verifier._refresh_jwks_key) == ["kid"], "fastmcp: _refresh_jwks_key changed"  # pyright: ignore[reportPrivateUsage]
    lookup = inspect.getsource(verifier._get_jwks_key)  # pyright: ignore[reportPrivateUsage]
    assert "self._jwks_last_refresh_attempt" in lookup, "fastmcp: the JWKS refresh interval is kept elsewhere"
    assert "async with self._shared_jwks_refresh_lock" in lookup, "fastmcp: the JWKS refresh lock moved"
    made = JWTVerifier(jwks_uri="https://idp.test/jwks", issuer="https://idp.test", algorithm="RS256")
    assert made._jwks_cache == {}, "fastmcp: the JWKS cache is no longer a dict of kid to key"  # pyright: ignore[reportPrivateUsage]
    assert isinstance(made._jwks_cache_time, int | float), "fastmcp: the JWKS fetch time moved"  # pyright: ignore[reportPrivateUsage]
    # A lookup that fetched nothing (the interval not passed) is told by the attempt's time
    # left as it was: _not_fetched_again reads the interval.
    assert made._jwks_refresh_interval == 30.0, "fastmcp: the JWKS refresh interval moved"  # pyright: ignore[reportPrivateUsage]
    assert "self._jwks_last_refresh_attempt = current_time" in lookup, (
        "fastmcp: the attempt is marked elsewhere"
    )


def test_fastmcps_jwt_verifier_reads_its_nbf_bound_from_the_module_global_the_gateway_lifts() -> None:
    # compat/fastmcp.leave_nbf_to_caller makes the module's bound infinite: the verifier must
    # read it there, at each check (a bound kept per verifier, or copied, would be left as it was).
    from fastmcp.server.auth.providers import jwt as fastmcp_jwt

    assert isinstance(fastmcp_jwt._NBF_CLOCK_SKEW_SECONDS, int | float), "fastmcp: the nbf bound moved"  # pyright: ignore[reportPrivateUsage]
    check = inspect.getsource(JWTVerifier.load_access_token)
    assert "nbf > time.time() + _NBF_CLOCK_SKEW_SECONDS" in check, "fastmcp: nbf is checked otherwise now"


def test_fastmcps_stdio_run_is_still_what_run_stdio_repeats() -> None:
    # compat/fastmcp.run_stdio does what run_stdio_async does, with its own stdin reader.
    source = inspect.getsource(FastMCP.run_stdio_async)
    for step in (
        'set_transport("stdio")',
        "self._lifespan_manager()",
        "stdio_server()",
        "self._mcp_server.run(",
        "create_initialization_options()",
    ):
        assert step in source, f"fastmcp: run_stdio_async no longer does {step} (compat/fastmcp.run_stdio)"
    assert "stdin" in inspect.signature(stdio_server).parameters, "mcp: stdio_server takes no stdin now"
    # ... and reads it as run_stdio's StdinLines can be read: iterated, after a truth test.
    reads = inspect.getsource(stdio_server)
    assert "async for line in stdin" in reads, "mcp: stdio_server no longer iterates its stdin"
    assert "if not stdin:" in reads, "mcp: stdio_server tests its stdin otherwise now"


async def test_fastmcps_root_middleware_is_skipped_for_the_gateways_own_methods_only() -> None:
    # FastMCP's root middleware binds its request context (what its get_context reads) for
    # every request; past_fastmcp finds it by its class in the chain and keeps it for the rest.
    server = FastMCP("x")
    lowlevel = fastmcp_compat.lowlevel_server(server)
    fastmcp_compat.past_fastmcp(lowlevel, frozenset({"tools/call"}))
    [root] = [m for m in lowlevel.middleware if type(m).__name__ == "_WhereFastMCPServes"]
    seen: dict[str, bool] = {}

    async def handler(ctx: Any) -> dict[str, Any]:
        try:
            get_context()
        except RuntimeError:
            seen[ctx.method] = False
        else:
            seen[ctx.method] = True
        return {}

    for method in ("tools/call", "ping"):
        ctx = ServerRequestContext[Any, Any](
            session=None,  # pyright: ignore[reportArgumentType]
            lifespan_context=None,
            protocol_version="2025-11-25",
            method=method,
            params={},
            request_id=1,
        )
        await root(ctx, handler)
    assert seen == {"tools/call": False, "ping": True}


# -- httpx2, langchain, langgraph ----------------------------------------------------------


def test_httpx2_reads_the_proxy_environment_as_the_aiohttp_transport_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    proxies = httpx2_compat.get_environment_proxies()
    assert proxies.get("https://") == "http://proxy.internal:3128"
    assert httpx2_compat.URLPattern("https://").matches(httpx2.URL("https://example.com"))


def test_httpx2s_event_source_reads_through_the_parser_the_noise_bound_reads_as_it_does() -> None:
    # compat/http_streams._FlooredEvents reads a stream as EventSource.__aiter__ does, with its
    # parser, and takes the size of the event not yet ended from the parser's two decoders.
    source = inspect.getsource(httpx2.EventSource.__aiter__)
    for used in ("request_context(request=", "_SSEParser(self._max_event_size)", "aiter_text()", "flush()"):
        assert used in source, used
    parser = _SSEParser(None)
    assert [event.data for event in parser.decode("data: a\n\n")] == ["a"]
    assert list(parser.decode("data: part")) == []
    assert parser._line_decoder.pending_size == len("data: part")  # pyright: ignore[reportPrivateUsage]
    assert list(parser.decode("\ndata: more\n")) == []
    assert parser._line_decoder.pending_size == 0  # pyright: ignore[reportPrivateUsage]
    assert parser._event_decoder._event_size >= len("partmore")  # pyright: ignore[reportPrivateUsage]
    assert "request" in inspect.signature(request_context).parameters


def test_chat_anthropic_still_builds_its_client_from_client_params() -> None:
    chat = ChatAnthropic(model_name="claude-test", api_key="sk-test", timeout=5, stop=None)  # type: ignore[call-arg]
    params = langchain_compat.anthropic_client_params(chat)
    assert params["api_key"] == "sk-test"
    sentinel = object()
    langchain_compat.use_async_client(chat, sentinel)
    assert chat._async_client is sentinel  # pyright: ignore[reportPrivateUsage]


def test_each_chat_model_still_names_its_type_in_llm_type() -> None:
    openai = langchain_compat.openai_chat(
        model="gpt-test", api_key="sk-test", base_url="http://127.0.0.1:9/v1"
    )
    anthropic = ChatAnthropic(model_name="claude-test", api_key="sk-test", timeout=5, stop=None)  # type: ignore[call-arg]
    assert langchain_compat.model_type(openai) == "openai-chat", "langchain-openai: _llm_type changed"
    assert langchain_compat.model_type(anthropic) == "anthropic-chat", (
        "langchain-anthropic: _llm_type changed"
    )


def test_chat_openai_still_makes_its_message_in_create_chat_result() -> None:
    chat = langchain_compat.openai_chat(model="gpt-test", api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "[1]"}},
        {"id": "c2", "type": "function", "function": {"name": "t", "arguments": '{"a": 1}'}},
    ]
    response = {
        "id": "r",
        "model": "gpt-test",
        "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": calls}}
        ],
    }
    result = chat._create_chat_result(response)  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]
    message = result.generations[0].message
    assert isinstance(message, AIMessage), "langchain-openai: _create_chat_result made no AIMessage"
    assert [c["args"] for c in message.tool_calls] == [{"a": 1}]
    assert [c["args"] for c in message.invalid_tool_calls] == ["[1]"]


def test_the_in_memory_saver_keeps_its_three_maps() -> None:
    saver = InMemorySaver()
    for name in ("storage", "writes", "blobs", "serde"):
        assert hasattr(saver, name), f"langgraph: InMemorySaver.{name} is gone (compat/langgraph.py)"


async def test_the_sqlite_saver_keeps_its_checkpoint_tables(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()
    with sqlite3.connect(path) as db:
        for table in langgraph_compat.CHECKPOINT_TABLES:
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            assert {"thread_id", "checkpoint_ns", "checkpoint_id"} <= columns, (
                f"langgraph-checkpoint-sqlite: table {table} has {columns} (compat/langgraph.py)"
            )


def test_the_postgres_saver_keeps_the_tables_and_columns_compaction_deletes_from() -> None:
    schema = " ".join(AsyncPostgresSaver.MIGRATIONS)
    columns = {
        "checkpoints": ("thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint JSONB"),
        "checkpoint_blobs": ("thread_id", "checkpoint_ns", "channel", "version"),
        "checkpoint_writes": ("thread_id", "checkpoint_ns", "checkpoint_id"),
    }
    assert set(columns) == set(langgraph_compat.POSTGRES_TABLES)
    for table, wanted in columns.items():
        created = schema.split(f"CREATE TABLE IF NOT EXISTS {table} (", 1)
        assert len(created) == 2, f"langgraph-checkpoint-postgres: no table {table} (compat/langgraph.py)"
        body = created[1].split(");", 1)[0]
        for column in wanted:
            assert column in body, (
                f"langgraph-checkpoint-postgres: {table} has no {column} (compat/langgraph.py)"
            )


# -- uvicorn (the listener's bounds, ``agent_gateway.listener``) ------------------------------


@pytest.mark.parametrize(
    "member",
    [
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_complete",
        "on_body",
        "on_headers_complete",
        "on_response_complete",
        "send_400_response",
        "_unsupported_upgrade_warning",
        "_start_asgi_task",
        "shutdown",
    ],
)
def test_uvicorns_protocol_has_each_method_the_listener_overrides(member: str) -> None:
    assert callable(getattr(HttpToolsProtocol, member, None)), f"uvicorn: HttpToolsProtocol.{member} is gone"


def test_uvicorns_protocol_keeps_the_transport_the_listener_closes() -> None:
    tree = ast.parse(inspect.getsource(HttpToolsProtocol.connection_made).strip().replace("\n    ", "\n"))
    stored = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    assert "transport" in stored, "uvicorn: HttpToolsProtocol.connection_made no longer keeps its transport"


def test_uvicorns_protocol_keeps_its_cycle_and_pipeline_as_the_listener_reads_them() -> None:
    # The listener arms the next head's deadline only when the latest cycle's response is
    # complete (no pipelined request running): those members must still mean that.
    source = inspect.getsource(HttpToolsProtocol.on_response_complete)
    assert "self.pipeline" in source, "uvicorn: on_response_complete no longer starts pipelined requests"
    cycle = inspect.getsource(RequestResponseCycle.__init__)
    assert "self.response_complete = False" in cycle, (
        "uvicorn: RequestResponseCycle.response_complete is gone"
    )
    assert "self.cycle = " in inspect.getsource(HttpToolsProtocol.on_headers_complete)
    # The listener bounds the requests waiting behind the one served, and a waiting one's body,
    # in the queue and the buffer uvicorn keeps them in.
    assert "self.pipeline.appendleft(" in inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert "self.cycle.body += body" in inspect.getsource(HttpToolsProtocol.on_body)
    # The listener counts a head's lines in the list uvicorn keeps them in, and puts an
    # absolute-form target's host there (the target as uvicorn keeps it, whole).
    assert "self.headers.append(" in inspect.getsource(HttpToolsProtocol.on_header)
    assert "self.url += url" in inspect.getsource(HttpToolsProtocol.on_url)
    assert '"headers": self.headers' in inspect.getsource(HttpToolsProtocol.on_message_begin)
    # An upgrade it does not take is reported in the one method the listener replaces.
    assert "self._unsupported_upgrade_warning()" in inspect.getsource(HttpToolsProtocol.data_received)
    assert "self.cycle.keep_alive = False" in inspect.getsource(HttpToolsProtocol.shutdown)
    # The listener tells the request being served that its client left: it knows that request
    # as the one each start is given, and tells it as uvicorn tells the one read last.
    assert "self._start_asgi_task(self.cycle, app)" in inspect.getsource(
        HttpToolsProtocol.on_headers_complete
    )
    assert "self._start_asgi_task(cycle, app)" in inspect.getsource(HttpToolsProtocol.on_response_complete)
    assert "self.disconnected = False" in cycle, "uvicorn: RequestResponseCycle.disconnected is gone"
    assert "self.message_event = message_event" in cycle, (
        "uvicorn: RequestResponseCycle.message_event is gone"
    )
    lost = inspect.getsource(HttpToolsProtocol.connection_lost)
    assert "self.cycle.disconnected = True" in lost
    assert "self.cycle.message_event.set()" in lost


def test_uvicorns_server_takes_its_signals_in_the_method_the_gateway_and_tests_override() -> None:
    # starting.Unsignalled and tests.support's servers leave signals alone by overriding it: were
    # it renamed (as install_signal_handlers was), uvicorn would take SIGTERM again unnoticed.
    assert "capture_signals" in vars(uvicorn.Server), "uvicorn: Server.capture_signals is gone (starting.py)"
    assert inspect.signature(uvicorn.Server.capture_signals).parameters.keys() == {"self"}


# -- the seam is the only place --------------------------------------------------------------

_PRIVATE_MODULE = ("mcp.client._", "mcp.shared._", "httpx2._", "fastmcp._", "langgraph._")


def test_no_module_outside_compat_imports_a_private_module_of_a_dependency() -> None:
    found = []
    for path in SRC.rglob("*.py"):
        if "compat" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_PRIVATE_MODULE):
                found.append(f"{path.relative_to(SRC)}: from {node.module}")
    assert found == []


def _own_privates(trees: list[ast.Module]) -> set[str]:
    """The private names our own classes define (``self._x = ...``, ``_x: T`` in a class)."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                own.add(node.name)
    return {name for name in own if name.startswith("_")}


def test_no_module_outside_compat_reaches_a_private_member_of_a_dependency() -> None:
    sources = {path: ast.parse(path.read_text()) for path in SRC.rglob("*.py")}
    ours = _own_privates([tree for path, tree in sources.items() if "compat" not in path.parts])
    found = []
    for path, tree in sources.items():
        if "compat" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in ours
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


OVERRIDDEN = {
    # LangChain's chat-model extension points (its docs' "implement _generate, _llm_type").
    "agent.sampling.SamplingChatModel._agenerate (langchain_core BaseChatModel)",
    "agent.sampling.SamplingChatModel._generate (langchain_core BaseChatModel)",
    "agent.sampling.SamplingChatModel._llm_type (langchain_core BaseChatModel)",
    # FastMCP's Provider hooks: a provider serves its components by overriding these.
    "components.CatalogProvider._get_prompt (fastmcp Provider)",
    "components.CatalogProvider._get_resource (fastmcp Provider)",
    "components.CatalogProvider._get_resource_template (fastmcp Provider)",
    "components.CatalogProvider._list_prompts (fastmcp Provider)",
    "components.CatalogProvider._list_resource_templates (fastmcp Provider)",
    "components.CatalogProvider._list_resources (fastmcp Provider)",
}
"""Private methods of a dependency's class that our subclasses outside ``compat/`` override
(uvicorn's, in ``listener.py``, are checked by the uvicorn tests above)."""


def test_each_private_method_we_override_outside_compat_is_known_and_still_there() -> None:
    # The guard above counts any ``def _x`` as ours, so an override of a dependency's private
    # method passes it: this finds each one, by the classes' MROs, and fails on a new one (list
    # it here, with why) or on one whose base no longer defines it (the override is dead).
    found = set()
    for info in pkgutil.walk_packages(agent_gateway.__path__, "agent_gateway."):
        if ".compat" in info.name:
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for name, member in vars(cls).items():
                own_code = inspect.isfunction(member) or isinstance(member, property)
                if (
                    not name.startswith("_") or name.endswith("_") or not own_code
                ):  # not dunders, enums' sunders
                    continue
                base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
                if base is not None and not base.__module__.startswith("agent_gateway"):
                    where = f"{module.__name__.removeprefix('agent_gateway.')}.{cls.__qualname__}"
                    found.add(f"{where}.{name} ({base.__module__.split('.')[0]} {base.__qualname__})")
    assert found == OVERRIDDEN


def test_jsonschema_matches_every_pattern_through_the_re_the_seam_bounds() -> None:
    from jsonschema import validators

    from agent_gateway.compat import jsonschema as seam

    seam.install()
    for module in seam.SEARCHING_MODULES:
        assert module.re is seam.bounded, module.__name__  # pyright: ignore[reportAttributeAccessIssue]
        assert "re.search(" in inspect.getsource(module), module.__name__
    for keyword in ("pattern", "patternProperties", "additionalProperties", "unevaluatedProperties"):
        found = validators.Draft202012Validator.VALIDATORS[keyword]
        assert inspect.getmodule(found) in seam.SEARCHING_MODULES, keyword


def test_a_log_record_names_no_caller_once_srcfile_is_none() -> None:
    """``compat.stdlib.lean_log_records`` sets ``logging._srcfile`` to None, as the logging HOWTO
    advises, so no record walks the stack for its caller: the attribute must still gate that."""
    assert hasattr(logging, "_srcfile")
    records: list[logging.LogRecord] = []
    probe = logging.getLogger("agent_gateway.tests.compat.srcfile")
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    probe.addHandler(handler)
    saved = logging._srcfile  # pyright: ignore[reportPrivateUsage]
    try:
        logging._srcfile = None  # pyright: ignore[reportPrivateUsage]
        probe.warning("no caller")
        # logging's own value (whatever an earlier test left): its file, as the module sets it
        logging._srcfile = os.path.normcase(logging.addLevelName.__code__.co_filename)  # pyright: ignore[reportPrivateUsage]
        probe.warning("a caller")
    finally:
        logging._srcfile = saved  # pyright: ignore[reportPrivateUsage]
        probe.removeHandler(handler)
    assert [r.funcName for r in records] == [
        "(unknown function)",
        "test_a_log_record_names_no_caller_once_srcfile_is_none",
    ]


async def test_an_exit_stack_shows_whether_it_holds_anything_to_unwind() -> None:
    """``compat.stdlib.holds_callbacks`` reads ``AsyncExitStack._exit_callbacks``: a modern-era
    request's connection is unwound only when it holds something (``compat/exchange._served``)."""
    stack = AsyncExitStack()
    assert not holds_callbacks(stack)
    ran: list[int] = []
    stack.callback(ran.append, 1)
    assert holds_callbacks(stack)
    await stack.aclose()
    assert ran == [1]
    assert not holds_callbacks(stack)


def test_the_sdk_client_words_its_result_checks_as_the_gateway_recognizes_them() -> None:
    # ``compat.mcp.result_check_failed`` tells the SDK's verdict on a result against its
    # tool's output schema (a bare RuntimeError) from a bug by these words.
    from mcp.client.session import ClientSession

    from agent_gateway.compat.mcp import RESULT_CHECKS

    source = inspect.getsource(ClientSession.validate_tool_result)
    for words in RESULT_CHECKS:
        assert words in source, f"mcp: ClientSession.validate_tool_result no longer says {words!r}"


def test_the_sdk_client_session_warns_of_malformed_notifications_on_its_own_logger() -> None:
    # logs.PeerRepeats bounds the warnings of the client session's logger (its name read from
    # the module: it is "client", not the module's name). Were the warning written elsewhere,
    # an upstream could write a traceback per notification again.
    import mcp.client.session

    source = inspect.getsource(mcp.client.session)
    assert "logger = logging.getLogger(" in source
    assert 'logger.warning("Failed to validate notification: %s", method, exc_info=True)' in source


def test_websockets_answers_pings_in_the_protocols_recv_frame_which_each_parsed_frame_goes_through() -> None:
    # compat.websockets checks each ping before answering it by replacing the protocol's
    # recv_frame on the instance: the parser must still call it through self for every frame,
    # recv_frame must still be where a ping's pong is queued, and fail() must still swap the
    # parser for one that discards the rest of the read (what stops a flood's parsing).
    from websockets.asyncio.client import ClientConnection, connect
    from websockets.asyncio.connection import Connection
    from websockets.protocol import Protocol

    assert "self.recv_frame(frame)" in inspect.getsource(Protocol.parse)
    receiving = inspect.getsource(Protocol.recv_frame)
    assert "opcode is PING" in receiving
    assert "Frame(PONG, frame.data)" in receiving
    assert "self.parser = self.discard()" in inspect.getsource(Protocol.fail)
    assert "create_connection" in inspect.signature(connect).parameters
    assert "create_connection(\n                protocol," in inspect.getsource(connect.__init__)
    for member in ("connection_lost", "data_received"):
        assert callable(getattr(ClientConnection, member, None)), f"websockets: Connection.{member} is gone"
    # A read's frames are all parsed inside data_received (what FRAMES_PER_READ counts), which
    # only notes a close's deadline (what the gateway's own drop acts on).
    received = inspect.getsource(Connection.data_received)
    assert "self.protocol.receive_data(data)" in received
    assert "self.close_deadline = " in received
    assert callable(getattr(Protocol, "close_expected", None))
    assert "self.transport = transport" in inspect.getsource(Connection.connection_made)
    made = inspect.getsource(Connection.__init__)
    assert "self.loop = " in made
    assert "self.close_timeout = close_timeout" in made


def test_an_ended_spans_status_is_what_restatus_writes() -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_status(StatusCode.ERROR, "x" * 10)
    assert isinstance(span, ReadableSpan)
    restatus(span, "cut")
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, "cut")


def test_starlettes_cors_middleware_asks_is_allowed_origin_for_preflights_and_answers() -> None:
    # cors.ListedOrigins matches origins as the Origin check does by replacing this one method.
    from starlette.middleware.cors import CORSMiddleware

    for method in (CORSMiddleware.preflight_response, CORSMiddleware.send):
        assert "self.is_allowed_origin(origin=" in inspect.getsource(method), (
            f"starlette: CORSMiddleware.{method.__name__} no longer asks is_allowed_origin"
        )
