"""A property: whatever a client sends, every request gets a result or a well-formed JSON-RPC
error, and the gateway keeps serving. Hypothesis draws random requests, valid and not (known
and unknown methods and names, arguments of any JSON shape, broken envelopes), in both
protocol eras, and shrinks any counterexample to a minimal one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import RunningGateway, initialize, python_upstream, running_gateway

MODERN = "2026-07-28"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
METHODS = [
    "tools/call",
    "tools/list",
    "prompts/get",
    "prompts/list",
    "resources/read",
    "resources/list",
    "resources/templates/list",
    "completion/complete",
    "logging/setLevel",
    "ping",
]
NAMES = ["counter__increment", "counter__pid", "ask_agent", "counter__missing", "", "x" * 300]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def params(draw: st.DrawFn, method: str) -> Any:
    """Params that are often right in shape, sometimes wrong, sometimes any JSON at all."""
    shaped: dict[str, Any] = {}
    if method in ("tools/call", "prompts/get"):
        shaped["name"] = draw(st.sampled_from(NAMES) | st.text(max_size=20) | st.integers())
        shaped["arguments"] = draw(
            st.fixed_dictionaries({}, optional={"by": st.integers() | st.text(max_size=5)}) | json_values
        )
    elif method == "resources/read":
        shaped["uri"] = draw(st.sampled_from(["counter://nothing", "not a uri", ""]) | st.integers())
    elif method == "logging/setLevel":
        shaped["level"] = draw(st.sampled_from(["debug", "error", "loud"]) | json_values)
    elif method == "completion/complete":
        shaped["ref"] = draw(json_values)
        shaped["argument"] = draw(json_values)
    return draw(st.just(shaped) | json_values)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    method = draw(st.sampled_from(METHODS) | st.text(max_size=20))
    request: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": draw(st.integers(1, 10**6) | st.text(min_size=1, max_size=8)),
        "method": method,
    }
    drawn = draw(params(method))
    if drawn is not None or draw(st.booleans()):
        request["params"] = drawn
    if draw(st.integers(0, 9)) == 0:  # now and then a broken envelope
        request[draw(st.sampled_from(["jsonrpc", "id", "method"]))] = draw(json_values)
    return request


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[RunningGateway, str]]:
    """A gateway in its own thread (Hypothesis drives sync tests), and a handshake session."""
    config = {"upstreams": {"counter": python_upstream("counter.py", include=["increment", "pid"])}}
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(running_gateway(config)) as gw,
        httpx.Client(timeout=30) as http,
    ):
        session = http.post(gw.url, json=initialize("h"), headers=HEADERS).headers["mcp-session-id"]
        http.post(
            gw.url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=HEADERS | {"Mcp-Session-Id": session},
        )
        yield gw, session


def messages_of(answer: httpx.Response) -> list[dict[str, Any]]:
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        # split("\n"), not splitlines(): that also splits on characters JSON strings may hold.
        return [json.loads(line[5:]) for line in answer.text.split("\n") if line.startswith("data:")]
    return [json.loads(answer.text)]


def assert_answered(request: dict[str, Any], answer: httpx.Response) -> None:
    assert answer.status_code < 500, (answer.status_code, answer.text[:300])
    final = messages_of(answer)[-1]  # progress or log notifications may come first
    assert final.get("jsonrpc") == "2.0", final
    if "error" in final:
        error = final["error"]
        assert isinstance(error.get("code"), int), final
        assert isinstance(error.get("message"), str), final
        assert error["message"], final
    else:
        assert answer.status_code == 200, (answer.status_code, final)
        assert "result" in final, final
        assert final.get("id") == request.get("id"), final


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests(), era=st.sampled_from(["handshake", "modern"]))
def test_every_request_gets_a_result_or_a_well_formed_error(
    gateway: tuple[RunningGateway, str], request: dict[str, Any], era: str
) -> None:
    gw, session = gateway
    headers = dict(HEADERS)
    if era == "handshake":
        headers["Mcp-Session-Id"] = session
    else:
        headers |= {"Mcp-Protocol-Version": MODERN}
        if isinstance(request.get("params"), dict):
            request["params"]["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": {"name": "h", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
    with httpx.Client(timeout=30) as http:
        answer = http.post(gw.url, content=json.dumps(request), headers=headers)
        assert_answered(request, answer)
        # And it still serves: a good call right after.
        alive = http.post(
            gw.url,
            json={
                "jsonrpc": "2.0",
                "id": "alive",
                "method": "tools/call",
                "params": {"name": "counter__pid", "arguments": {}},
            },
            headers=HEADERS | {"Mcp-Session-Id": session},
        )
        assert "result" in messages_of(alive)[-1]
