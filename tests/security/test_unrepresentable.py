"""Values a client's JSON text may hold that cannot be passed on as written: a number past a
double's range (``1e400``, read as infinity, which reached the upstream as null) and a lone
UTF-16 surrogate (``"\\ud800"``: valid JSON text, but no UTF-8 text holds it; on the modern
lane it reached the gateway's own writers of UTF-8, and one such call took the whole gateway
down through its audit writer). Each is a parse error, on both lanes, that costs nobody else
anything. Found by a helper's attack (stop 50)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import httpx
import pytest
from fastmcp import FastMCP

from agent_gateway.audit import chained
from agent_gateway.audit_verify import verify
from tests.support import gateway_child, running_gateway, serving_upstream
from tests.test_exchange import ENVELOPE
from tests.test_exchange import HEADERS as MODERN_HEADERS

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
VERSION = "2025-06-18"
PARSE_ERROR = -32700


def recorder(received: list[object]) -> FastMCP:
    server = FastMCP("rec")

    @server.tool
    def keep(x: object = "unset") -> str:
        received.append(x)
        return "kept"

    return server


def modern_call(name: str, arguments: str, request_id: int = 3) -> tuple[bytes, dict[str, str]]:
    """A modern-era ``tools/call`` written by hand, so its escapes and numbers stay as written."""
    params = f'{{"name":"{name}","arguments":{arguments},"_meta":{json.dumps(ENVELOPE)}}}'
    body = f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":{params}}}'
    headers = MODERN_HEADERS | {"mcp-method": "tools/call"}
    return body.encode(), headers | ({"mcp-name": name} if "\\u" not in name else {})


async def handshake_call(http: httpx.AsyncClient, url: str, name: str, arguments: str) -> httpx.Response:
    info = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
    opening = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": info}
    answer = await http.post(url, json=opening, headers=HEADERS)
    headers = HEADERS | {"mcp-session-id": answer.headers["mcp-session-id"], "mcp-protocol-version": VERSION}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    body = f'{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"{name}","arguments":{arguments}}}}}'
    return await http.post(url, content=body, headers=headers)


@pytest.mark.parametrize("lane", ["handshake", "modern"])
@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("rec__keep", '{"x":1e400}'),
        ("call_tool", '{"name":"rec__keep","arguments":{"x":-1e400}}'),
        ("rec__keep", '{"x":"\\ud800"}'),
        ("call_tool", '{"name":"rec__keep","arguments":{"x":"a\\udc00b"}}'),
        ("search_tools", '{"query":"\\ud800"}'),
    ],
    ids=["overflow", "overflow-call_tool", "surrogate", "surrogate-call_tool", "surrogate-search"],
)
async def test_a_value_json_cannot_pass_on_is_a_parse_error_and_reaches_no_upstream(
    lane: str, name: str, arguments: str, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[object] = []
    async with (
        serving_upstream(recorder(received)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}, "search": {"mode": "on"}}) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        with caplog.at_level(logging.ERROR):
            if lane == "modern":
                body, headers = modern_call(name, arguments)
                answer = await http.post(gw.url, content=body, headers=headers)
            else:
                answer = await handshake_call(http, gw.url, name, arguments)
        # The same call with a value JSON carries is served (the client is not refused as such).
        body, headers = modern_call("rec__keep", '{"x":1.5}', request_id=4)
        served = (await http.post(gw.url, content=body, headers=headers)).json()
    assert answer.json()["error"]["code"] == PARSE_ERROR, answer.text
    assert (received, served["result"]["content"][0]["text"]) == ([1.5], "kept")
    assert [r.getMessage() for r in caplog.records if r.exc_info is not None] == []


async def test_a_surrogates_own_bytes_in_a_modern_request_are_a_parse_error() -> None:
    # Not an escape: the three bytes UTF-8 would give a surrogate, which json.loads decodes
    # ("surrogatepass") where a strict UTF-8 reader refuses them.
    received: list[object] = []
    async with (
        serving_upstream(recorder(received)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        body, headers = modern_call("rec__keep", '{"x":"SURROGATE"}')
        answer = await http.post(gw.url, content=body.replace(b"SURROGATE", b"\xed\xa0\x80"), headers=headers)
    assert (answer.json()["error"]["code"], received) == (PARSE_ERROR, [])


ENCODED = {  # what json.loads reads (a byte-order mark; UTF-16 and UTF-32, their ASCII valid UTF-8)
    "utf8-bom": lambda body: b"\xef\xbb\xbf" + body,
    "utf16-le": lambda body: body.decode().encode("utf-16-le"),
    "utf16-be": lambda body: body.decode().encode("utf-16-be"),
    "utf32-le": lambda body: body.decode().encode("utf-32-le"),
}


@pytest.mark.parametrize(
    ("encoding", "arguments"),
    [
        ("utf8-bom", '{"x":NaN}'),
        ("utf16-le", '{"x":1e400}'),
        ("utf16-be", '{"x":"\\ud800"}'),
        ("utf32-le", "{}"),
    ],
)
async def test_a_modern_body_not_in_utf8_is_a_parse_error_not_read_past_the_checks(
    encoding: str, arguments: str
) -> None:
    # Admission read such a body as "not JSON" and let it through unchecked; the SDK's modern
    # entry then read it with json.loads, which detects each, and NaN reached the upstream.
    received: list[object] = []
    async with (
        serving_upstream(recorder(received)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        body, headers = modern_call("rec__keep", arguments)
        answer = await http.post(gw.url, content=ENCODED[encoding](body), headers=headers)
    assert (answer.json()["error"]["code"], received) == (PARSE_ERROR, [])


async def test_one_call_naming_a_lone_surrogate_leaves_the_gateway_serving(tmp_path: Path) -> None:
    # The inner name of call_tool is in no routing header: before, the SDK's checks let it
    # through, and its audit record ended the audit writer and, with it, the process.
    received: list[object] = []
    async with (
        serving_upstream(recorder(received)) as url,
        gateway_child({"upstreams": {"rec": {"url": url}}}, tmp_path) as (base, child),
        httpx.AsyncClient(timeout=10) as http,
    ):
        body, headers = modern_call("call_tool", '{"name":"\\ud800"}')
        refused = await http.post(f"{base}/mcp", content=body, headers=headers)
        body, headers = modern_call("rec__keep", '{"x":"after"}', request_id=4)
        served = (await http.post(f"{base}/mcp", content=body, headers=headers)).json()
        audit = tmp_path / ".agent-gateway" / "audit.jsonl"
        with anyio.fail_after(10):  # the bystander's call audited: the writer lives on
            while '"rec__keep"' not in (audit.read_text() if audit.exists() else ""):
                await anyio.sleep(0.05)
        alive = child.poll() is None
    assert refused.json()["error"]["code"] == PARSE_ERROR, refused.text
    assert (served["result"]["content"][0]["text"], received, alive) == ("kept", ["after"], True)


def test_an_audit_record_holding_a_lone_surrogate_is_written_and_verifies(tmp_path: Path) -> None:
    # Admission refuses them; should one come another way, the writer goes on, a '?' for it.
    line, digest = chained({"tool": "rec__keep", "arguments": {"x": "a\ud800b"}}, 1, "0" * 64)
    path = tmp_path / "audit.jsonl"
    path.write_text(line, encoding="utf-8")
    assert json.loads(line)["arguments"] == {"x": "a?b"}
    assert (verify([path]).problem, json.loads(line)["hash"]) == (None, digest)
