"""What a client's trace context and an upstream's errors make of the gateway's telemetry:
the warnings a malformed ``tracestate`` or an attribute over its bound draws are written once
per kind, not once a request, and an upstream's error message cannot make a span of megabytes
(found by a helper's attack, stop 65: 500 lines for 500 requests, 400 for 400; 300 errors of
1 MB held 480 MB in the export queue)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from starlette.types import Scope, Send

from agent_gateway.exporters import MAX_ATTRIBUTE_LENGTH
from tests.otlp import SpanSeen, otlp_receiver
from tests.security.test_leaks_and_forgeries import (
    TRACEPARENT,
    _answer,  # pyright: ignore[reportPrivateUsage]
    _echo_server,  # pyright: ignore[reportPrivateUsage]
    _session,  # pyright: ignore[reportPrivateUsage]
    gateway,
    text_log,
)
from tests.support import gateway_child, gateway_process, intercepted, serving, serving_upstream

CALLS = 40
TOO_MANY = ",".join(f"k{i}=v" for i in range(33))
"""A tracestate of 33 members (32 at most): the SDK warns and drops it."""


@pytest.mark.parametrize("carrier", ["headers", "meta"])
async def test_a_clients_malformed_tracestates_are_written_once_per_kind_not_once_a_request(
    carrier: str,
) -> None:
    async with gateway({}) as gw, httpx.AsyncClient(timeout=10) as http:
        headers = await _session(http, gw.url)
        with text_log(logging.WARNING) as log:
            for n in range(CALLS):
                context = {"traceparent": TRACEPARENT, "tracestate": TOO_MANY if n % 2 else f"BAD{n} KEY=1"}
                params: dict[str, Any] = {"name": "echo__echo", "arguments": {"text": "hi"}}
                sent = headers
                if carrier == "meta":
                    params["_meta"] = context
                else:
                    sent = headers | context
                call = {"jsonrpc": "2.0", "id": n + 2, "method": "tools/call", "params": params}
                assert (await http.post(gw.url, json=call, headers=sent)).status_code == 200
    warned = [line for line in log.getvalue().splitlines() if "opentelemetry.trace.span" in line]
    # The first of each of the two kinds; before, one a request (40).
    assert len(warned) == 2, warned
    assert any("BAD0 KEY=1" in line for line in warned), warned


ERROR_SIZE = 200_000


def _erring_upstream() -> Any:
    """``echo``, whose every call is answered with a JSON-RPC error of ``ERROR_SIZE`` characters."""
    server: FastMCP = _echo_server()

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        if request.get("method") != "tools/call":
            return False
        error = {"code": -32000, "message": "E" * ERROR_SIZE}
        await _answer(send, 200, {"jsonrpc": "2.0", "id": request.get("id"), "error": error})
        return True

    return intercepted(server, intercept)


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_an_upstreams_huge_error_message_is_cut_in_the_exported_span(
    protocol: str, tmp_path: Any
) -> None:
    # Through the SDK's client (legacy) and below it (auto: the modern upstream's direct path).
    async with (
        otlp_receiver() as (endpoint, received),
        serving(_erring_upstream()) as upstream,
    ):
        config = {
            "upstreams": {"api": {"url": f"{upstream}/mcp", "protocol": protocol}},
            "telemetry": {"otlp_endpoint": endpoint},
        }
        async with gateway_process(config, tmp_path) as base, Client(f"{base}/mcp", mode="auto") as client:
            try:
                result = await client.call_tool("api__echo", {"text": "hi"})
                assert result.is_error
            except MCPError:
                pass

            def failed(spans: list[SpanSeen]) -> bool:
                return any(s.kind == "CLIENT" and s.status_code == "ERROR" for s in spans)

            spans = await received.wait_for(failed, timeout=30)
    erred = [s for s in spans if s.status_code == "ERROR"]
    assert erred, spans
    for span in erred:
        assert len(span.status_message) <= MAX_ATTRIBUTE_LENGTH + 40, (span.name, len(span.status_message))
    client = [s for s in erred if s.kind == "CLIENT"]
    assert client[0].status_message.endswith(" characters)"), client[0].status_message[-80:]


LONG_URI = "file:///" + "u" * 2000
"""Over the 1,024 characters a span attribute keeps: the SDK warns each time it cuts one."""


async def test_a_clients_values_cut_in_its_spans_are_warned_of_once_not_once_a_request(tmp_path: Any) -> None:
    log = tmp_path / "gateway.log"
    async with (
        otlp_receiver() as (endpoint, _),
        serving_upstream(_echo_server()) as upstream,
        gateway_child(
            {"upstreams": {"echo": {"url": upstream}}, "telemetry": {"otlp_endpoint": endpoint}},
            tmp_path,
            log,
        ) as (base, _),
        Client(f"{base}/mcp") as client,
    ):
        for n in range(CALLS):
            with pytest.raises(MCPError):
                await client.read_resource(f"{LONG_URI}{n}")
        assert (await client.call_tool("echo__echo", {"text": "after"})).content
    warned = [line for line in log.read_text().splitlines() if "opentelemetry.attributes" in line]
    assert len(warned) == 1, warned  # before, one a request (40)
