"""Clients that send garbage, ask for what does not exist, flood, or hang up mid-call: each
gets a well-formed answer (or is let go), other clients are served throughout, and nothing
leaks (see ``harness``)."""

from __future__ import annotations

import base64
import json
import socket
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
from mcp import Client

from tests.faults.harness import Faulted, faulty_stdio, gateway_under_fault, text_of, wait_until
from tests.security.test_identity import SECRET, token
from tests.servers import many_tools
from tests.support import answer_before_the_body_ends, gateway_child, python_upstream, serving_upstream

MODERN = "2026-07-28"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def post(faulted: Faulted, body: bytes | dict[str, Any], session: str | None = None) -> httpx.Response:
    headers = HEADERS | ({"Mcp-Session-Id": session} if session else {})
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(faulted.gw.url, content=content, headers=headers)


def rpc_error(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC error in an answer (plain JSON, or the first SSE data line)."""
    text = answer.text
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    message = json.loads(text)
    assert message["jsonrpc"] == "2.0"
    return message["error"]


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


async def handshake(faulted: Faulted) -> str:
    answer = await post(faulted, INITIALIZE)
    session = answer.headers["mcp-session-id"]
    await post(faulted, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    return session


WRONG_TYPES = [
    ({"name": 42}, "params.name: should be a valid string"),
    ({"name": "faulty__ping", "arguments": 5}, "params.arguments: should be a valid dictionary"),
    (
        {"name": "faulty__ping", "_meta": {"progressToken": {"a": 1}}},
        "params._meta.progressToken: should be a valid string or a valid integer",
    ),
]
"""Params of the wrong type, and what the error answering each says."""


async def test_malformed_json_unknown_methods_and_wrong_types_get_json_rpc_errors() -> None:
    async with gateway_under_fault({"faulty": faulty_stdio()}) as faulted:
        garbage = await post(faulted, b'{"jsonrpc": "2.0", "id": 1, "method": ')
        assert garbage.status_code == 400
        assert rpc_error(garbage)["code"] == types.PARSE_ERROR

        session = await handshake(faulted)
        unknown = await post(faulted, {"jsonrpc": "2.0", "id": 2, "method": "no/such/method"}, session)
        assert rpc_error(unknown)["code"] == types.METHOD_NOT_FOUND

        # Each named by its field and what it should be (the SDK's own answer names nothing).
        for params, said in WRONG_TYPES:
            wrong = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
            error = rpc_error(await post(faulted, wrong, session))
            assert error["code"] == types.INVALID_PARAMS
            assert error["message"] == f"Invalid request parameters: {said}"

        not_rpc = await post(faulted, {"hello": "world"}, session)
        assert not_rpc.status_code == 400
        assert rpc_error(not_rpc)["code"] in (types.INVALID_REQUEST, types.PARSE_ERROR, types.INVALID_PARAMS)

        # MCP has no batches: an array, or any JSON not an object, is refused as one (the
        # SDK's answer was -32602 with pydantic's dump of the body).
        ping = {"jsonrpc": "2.0", "id": 4, "method": "ping"}
        for not_one in ([ping, ping | {"id": 5}], [], 5, "ping"):
            refused = await post(faulted, json.dumps(not_one).encode(), session)
            assert refused.status_code == 400
            assert rpc_error(refused) == {
                "code": types.INVALID_REQUEST,
                "message": "Body must be a single JSON-RPC request or notification object",
            }

        for bad_id in ([], {}, 1.5, True, None):  # the SDK would take these for notifications
            odd = await post(faulted, {"jsonrpc": "2.0", "id": bad_id, "method": "ping"}, session)
            assert odd.status_code == 400
            assert "a request id must be a string or an integer" in rpc_error(odd)["message"]

        async with Client(faulted.gw.url) as client:
            bad_arguments = await client.call_tool("faulty__slow", {"seconds": "soon"})
            assert bad_arguments.is_error
            assert "Invalid arguments for tool 'faulty__slow': seconds: 'soon' is not of type" in text_of(
                bad_arguments
            )
            unknown_tool = await client.call_tool("faulty__nope", {})
            assert unknown_tool.is_error
            assert "Unknown tool: 'faulty__nope'" in text_of(unknown_tool)


async def test_huge_arguments_are_refused_before_they_are_read_and_large_ones_pass() -> None:
    async with gateway_under_fault({"faulty": faulty_stdio()}) as faulted:
        start = b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"arguments": {"blob": "'
        with anyio.fail_after(10):  # the 5 MiB are never sent: refused on the headers
            refused = await answer_before_the_body_ends(
                faulted.gw.url, {**HEADERS, "Content-Length": str(5 * 2**20)}, start
            )
        assert refused.status == 413
        assert "the limit (server.max_body_bytes) is 4194304" in json.loads(refused.body)["error"]["message"]
        async with Client(faulted.gw.url) as client:  # under the limit: forwarded whole
            blob = "x" * 3 * 2**20
            assert text_of(await client.call_tool("faulty__size", {"blob": blob})) == str(len(blob))


async def test_ten_thousand_concurrent_requests_are_each_answered() -> None:
    config = faulty_stdio(max_concurrency=200)
    async with gateway_under_fault({"faulty": config}) as faulted:
        outcomes: dict[str, int] = {}
        lowlevel = faulted.gw.gateway.server._mcp_server  # pyright: ignore[reportPrivateUsage]

        # In memory: 10,000 requests really in flight at once on one session, no sockets.
        async def one(client: Client) -> None:
            result = await client.call_tool("faulty__ping", {})
            kind = "ok" if not result.is_error else text_of(result).split(":", 1)[1].strip()
            outcomes[kind] = outcomes.get(kind, 0) + 1

        with anyio.fail_after(240):
            async with Client(lowlevel) as client, anyio.create_task_group() as tg:
                for _ in range(10_000):
                    tg.start_soon(one, client)
        assert sum(outcomes.values()) == 10_000, outcomes
        # The client's own default bound (64 in flight) comes before the upstream's (200).
        assert outcomes.get("ok", 0) >= 64, outcomes
        assert set(outcomes) <= {"ok", "64 calls already in flight, the limit (max_concurrency) is 64"}, (
            outcomes
        )


async def test_a_client_that_hangs_up_mid_call_leaves_nothing_pending() -> None:
    # Handshake era: a dropped connection is not a cancel (the spec says so), so the call
    # runs out its timeout (2 s here), and then nothing is left of it.
    config = faulty_stdio(timeout=60, tool_timeouts={"hang": 2})
    async with gateway_under_fault({"faulty": config}) as faulted:
        guard = faulted.gw.gateway.pool.get("faulty").guard
        call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "faulty__hang"}}
        headers = HEADERS | {"Mcp-Session-Id": await handshake(faulted)}
        async with httpx.AsyncClient(timeout=30) as http, anyio.create_task_group() as tg:
            # No answer comes yet: the call has sent nothing, so the gateway holds its reply.
            tg.start_soon(partial(http.post, faulted.gw.url, json=call, headers=headers))
            await wait_until(lambda: guard.in_flight == 1)
            tg.cancel_scope.cancel()
        # Cancelling the request closed the connection with the call still pending.
        await wait_until(lambda: guard.in_flight == 0 and faulted.pending == 0)
        async with Client(faulted.gw.url) as client:
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"


async def test_a_modern_client_that_abandons_a_streaming_call_has_it_cancelled() -> None:
    # The call has reported progress (its answer is a stream) when the client hangs up.
    async with gateway_under_fault({"faulty": faulty_stdio(timeout=60)}) as faulted:
        guard = faulted.gw.gateway.pool.get("faulty").guard
        async with Client(faulted.gw.url, mode=MODERN) as client:
            with anyio.CancelScope() as scope:

                async def abandon(progress: float, total: float | None, message: str | None) -> None:
                    scope.cancel()

                await client.call_tool("faulty__hang", {"report": True}, progress_callback=abandon)
            abandoned = time.monotonic()
            await wait_until(lambda: guard.in_flight == 0 and faulted.pending == 0)
            assert time.monotonic() - abandoned < 5  # cancelled, not the 60 s timeout
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"


async def test_a_modern_client_that_abandons_its_request_has_the_call_cancelled_at_once() -> None:
    # Modern era: the mcp client aborts the request's POST, and that is the cancel.
    async with gateway_under_fault({"faulty": faulty_stdio(timeout=60)}) as faulted:
        guard = faulted.gw.gateway.pool.get("faulty").guard
        async with Client(faulted.gw.url, mode=MODERN) as client:
            with anyio.CancelScope() as scope:

                async def abandon() -> None:
                    await wait_until(lambda: guard.in_flight == 1)
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(abandon)
                    await client.call_tool("faulty__hang", {})
            abandoned = time.monotonic()
            await wait_until(lambda: guard.in_flight == 0 and faulted.pending == 0)
            assert time.monotonic() - abandoned < 5  # cancelled, not the 60 s timeout
            assert text_of(await client.call_tool("faulty__ping", {})) == "pong"


ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}
"""A modern-era request's ``_meta`` envelope."""

BAGGAGE = ",".join(f"k{n}=v" for n in range(3000))
"""A ``baggage`` header of 3,000 members (the W3C's bound: 180), 23 KB."""


async def test_a_clients_malformed_notifications_and_long_baggage_write_one_line_each(tmp_path: Path) -> None:
    """Each POST of a ``notifications/cancelled`` the SDK cannot read, and each request with
    a ``baggage`` header over 8 KiB, wrote a WARNING: the client chose how many (6,868 lines
    in 8 s from one client)."""
    log = tmp_path / "gateway.log"
    async with (
        gateway_child({"upstreams": {}}, tmp_path, log) as (base, _),
        httpx.AsyncClient(timeout=30) as http,
    ):
        url = f"{base}/mcp"
        opened = await http.post(url, json=INITIALIZE, headers=HEADERS)
        session = HEADERS | {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
        for n in range(100):
            malformed = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {}}}
            assert (await http.post(url, json=malformed, headers=session)).status_code == 202
            baggage = session | {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "baggage": BAGGAGE}
            ping = {"jsonrpc": "2.0", "id": n, "method": "ping"}
            assert (await http.post(url, json=ping, headers=baggage)).status_code == 200
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert len([line for line in warnings if "malformed params" in line]) == 1, warnings
    assert len([line for line in warnings if "Baggage" in line]) == 1, warnings


async def test_requests_uvicorn_cannot_read_write_one_line_in_the_gateways_log_not_one_each(
    tmp_path: Path,
) -> None:
    """uvicorn wrote "Invalid HTTP request received." for each such request in its own format
    (its own handler: past the gateway's filters and ``log_format: json``): a client chose how
    many lines, 200 connections 200 lines."""
    log = tmp_path / "gateway.log"
    async with gateway_child({"upstreams": {}}, tmp_path, log) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        for _ in range(30):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: \x01\r\n\r\n")
                assert (await stream.receive()).startswith(b"HTTP/1.1 400")
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(f"{base}/healthz")).status_code == 200  # still served
    lines = [line for line in log.read_text().splitlines() if "Invalid HTTP request received" in line]
    assert len(lines) == 1, lines
    assert "uvicorn.error" in lines[0]  # the gateway's own format names each line's logger


def _pipelined_then_gone(port: int, request: bytes, count: int) -> None:
    """``count`` requests sent on one connection at once; its first answer's first byte read,
    then the connection closed with the rest unread."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request * count)
        sock.recv(1)


async def test_a_client_that_pipelines_requests_and_hangs_up_writes_no_error(tmp_path: Path) -> None:
    """uvicorn marks only the last request it parsed as disconnected: the answer being written
    when such a client hung up went to a closed transport, which uvloop refuses: an ERROR
    traceback of 4 KB for each such connection, as many as a client liked."""
    log = tmp_path / "gateway.log"
    params = {"name": "search_tools", "arguments": {"query": "create a billing report", "limit": 50}}
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params | {"_meta": ENVELOPE}}
    )
    head = (
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json, text/event-stream\r\n"
        "Content-Type: application/json\r\nMcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\n"
        f"Mcp-Name: search_tools\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    config = {"upstreams": {"many": {"url": ""}}, "search": {"mode": "on"}}
    async with serving_upstream(many_tools.build([])) as url:
        config["upstreams"]["many"]["url"] = url
        async with gateway_child(config, tmp_path, log) as (base, _), httpx.AsyncClient(timeout=30) as http:
            idle = (await http.get(f"{base}/status")).json()
            port = int(base.rsplit(":", 1)[1])
            for _ in range(5):
                await anyio.to_thread.run_sync(_pipelined_then_gone, port, (head + body).encode(), 100)
            # Until every answer being written has ended, on a /status rendered since (at most
            # once a second: one asked for sooner is the idle one again).
            with anyio.fail_after(30):
                while (now := (await http.get(f"{base}/status")).json())["calls"] == idle["calls"] or (
                    now["tasks"] > idle["tasks"]
                ):
                    await anyio.sleep(0.05)
    assert "Exception in ASGI application" not in log.read_text()
    assert "ERROR" not in log.read_text()


async def test_forged_request_states_write_one_line_per_ten_seconds(tmp_path: Path) -> None:
    """The SDK writes a WARNING for each request whose ``requestState`` it cannot read: a
    client chose how many (1,000 lines in 1.4 s)."""
    log = tmp_path / "gateway.log"
    params = {"name": "counter__increment", "arguments": {}, "requestState": "eyJ" + "A" * 100}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params | {"_meta": ENVELOPE}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Mcp-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "counter__increment",
    }
    config = {"upstreams": {"counter": python_upstream("counter.py")}}
    async with gateway_child(config, tmp_path, log) as (base, _), httpx.AsyncClient(timeout=30) as http:
        answers = [
            (await http.post(f"{base}/mcp", json=body, headers=headers)).status_code for _ in range(30)
        ]
    lines = [line for line in log.read_text().splitlines() if "requestState rejected" in line]
    assert len(set(answers)) == 1, answers  # each refused alike
    assert len(lines) == 1, lines


async def test_a_clients_refusals_write_one_line_per_ten_seconds_and_another_clients_their_own(
    tmp_path: Path,
) -> None:
    """Each refused request wrote a WARNING: a client over its rate limit chose how many."""
    log = tmp_path / "gateway.log"
    tokens = [
        {"name": name, "token": f"{name}-token-0123456789", "policy": "slow"} for name in ("noisy", "quiet")
    ]
    auth = {
        "mode": "bearer",
        "tokens": tokens,
        "policies": {"slow": {"rate_limit": {"per_minute": 60, "burst": 5}}},
    }
    statuses: dict[str, list[int]] = {"noisy": [], "quiet": []}
    config = {"upstreams": {}, "auth": auth, "server": {"public_health": "full"}}  # /metrics scraped
    async with gateway_child(config, tmp_path, log) as (base, _), httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/mcp"
        for name, count in (("noisy", 200), ("quiet", 10)):
            headers = HEADERS | {"Authorization": f"Bearer {name}-token-0123456789"}
            for n in range(count):
                ping = {"jsonrpc": "2.0", "id": n, "method": "ping"}
                statuses[name].append((await http.post(url, json=ping, headers=headers)).status_code)
        scraped = (await http.get(f"{base}/metrics")).text
    refusals = [line for line in log.read_text().splitlines() if "over its rate limit" in line]
    assert statuses["noisy"].count(429) >= 190, statuses
    assert statuses["quiet"].count(429) >= 4, statuses
    assert len([line for line in refusals if "client noisy" in line]) in (1, 2), refusals  # 2: past 10 s
    assert len([line for line in refusals if "client quiet" in line]) == 1, refusals
    counted = next(
        line for line in scraped.splitlines() if 'reason="rate_limit"' in line and "refusals" in line
    )
    assert float(counted.rsplit(" ", 1)[1]) == statuses["noisy"].count(429) + statuses["quiet"].count(429)


async def test_a_second_request_under_an_id_being_answered_is_refused_and_the_first_answered() -> None:
    # Under one id (7, or "7", which the SDK takes for 7) the second took the first's place:
    # one POST got both calls' progress and the first's result, the other never ended, its
    # session pinned (one with a request in flight never makes way) till the client hung up.
    async with gateway_under_fault({"faulty": faulty_stdio()}) as faulted:
        guard = faulted.gw.gateway.pool.get("faulty").guard
        session = await handshake(faulted)
        answers: dict[str, httpx.Response] = {}

        async def send(name: str, body: dict[str, Any]) -> None:
            answers[name] = await post(faulted, body, session)

        for second_id in (7, "7"):
            call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
            first = call | {"params": {"name": "faulty__slow", "arguments": {"seconds": 1}}}

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send, "first", first)
                    await wait_until(lambda: guard.in_flight == 1)
                    second = call | {"id": second_id, "params": {"name": "faulty__ping", "arguments": {}}}
                    await send("second", second)
            refused = answers["second"]
            assert refused.status_code == 400
            assert rpc_error(refused) == {
                "code": types.INVALID_REQUEST,
                "message": f"request id {str(second_id)!r} is already in flight in this session",
            }
            assert json.loads(answers["first"].text)["result"]["content"][0]["text"] == "slept 1s"


async def test_requests_refused_401_write_no_line_each_and_fastmcps_lines_are_the_gateways(
    tmp_path: Path,
) -> None:
    # FastMCP's loggers had a Rich handler of their own: each 401 wrote its two lines past the
    # gateway's filters (1 ms of CPU each, never JSON, never throttled), and the verifier's
    # warning naming a token's 20,000-character subject was word-wrapped for 2.6 s.
    log = tmp_path / "gateway.log"
    auth = {"mode": "jwt", "jwt": {"secret": SECRET, "algorithm": "HS256", "audience": "gw"}}
    config = {"upstreams": {}, "auth": auth, "telemetry": {"log_format": "json"}}
    async with gateway_child(config, tmp_path, log) as (base, _), httpx.AsyncClient(timeout=30) as http:
        for n in range(20):  # signed, for another audience, its subject long and two lines
            signed = token(aud="other", sub=str(n) + "\n" + "s" * 20_000)
            headers = HEADERS | {"Authorization": f"Bearer {signed}"}
            ping = {"jsonrpc": "2.0", "id": n, "method": "ping"}
            assert (await http.post(f"{base}/mcp", json=ping, headers=headers)).status_code == 401
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    mismatched = [line for line in lines if "audience mismatch" in line]
    assert not [line for line in lines if "Auth error returned" in line]
    assert all(line.startswith("{") for line in lines), [
        line[:200] for line in lines if not line.startswith("{")
    ][:3]
    assert 1 <= len(mismatched) <= 2  # one a 10 s window: the client chose how many
    assert all(len(line) < 5_000 for line in mismatched)


def _deep_header_token(levels: int) -> str:
    """A token whose header nests ``levels`` deep: FastMCP parses it before any check."""
    header = b'{"alg":"HS256","typ":"JWT","x":' + b"[" * levels + b"]" * levels + b"}"
    encoded = base64.urlsafe_b64encode(header).rstrip(b"=").decode()
    return f"{encoded}.{token(sub='bot').split('.', 1)[1]}"


async def test_expired_and_unreadable_tokens_are_refused_401_in_one_line_per_ten_seconds(
    tmp_path: Path,
) -> None:
    # An expired token wrote FastMCP's INFO line, one without exp the gateway's own, per request
    # (5,842 lines in 5 s); a header nested 1,000 deep was a 500 and an ERROR traceback each.
    log = tmp_path / "gateway.log"
    auth = {"mode": "jwt", "jwt": {"secret": SECRET, "algorithm": "HS256", "audience": "gw"}}
    config = {"upstreams": {}, "auth": auth}
    tokens = {
        "expired": token(sub="bot", exp=int(time.time()) - 600),
        "no exp claim": token(sub="bot", exp=None),
        "nests too deeply": _deep_header_token(1000),
    }
    statuses: list[int] = []
    async with gateway_child(config, tmp_path, log) as (base, _), httpx.AsyncClient(timeout=30) as http:
        for signed in tokens.values():
            headers = HEADERS | {"Authorization": f"Bearer {signed}"}
            for n in range(30):
                ping = {"jsonrpc": "2.0", "id": n, "method": "ping"}
                statuses.append((await http.post(f"{base}/mcp", json=ping, headers=headers)).status_code)
    text = log.read_text()
    assert set(statuses) == {401}, statuses
    assert "ERROR" not in text
    assert "Traceback" not in text
    assert "token expired" not in text  # FastMCP's INFO line: at DEBUG only, as its others
    refused = [line for line in text.splitlines() if "bearer token refused" in line]
    assert len(refused) in (1, 2), refused  # 2: the requests took past a 10 s window


async def test_an_upstreams_questions_its_caller_cannot_take_are_refused_in_one_line_per_ten_seconds(
    tmp_path: Path,
) -> None:
    # Each question to a client that cannot take it (no elicitation, here) was refused with a
    # WARNING of its own: the upstream chose how many (2,700 lines in 6 s).
    log = tmp_path / "gateway.log"
    config = {"upstreams": {"faulty": python_upstream("faulty.py", protocol="legacy")}}  # asks by request
    async with (
        gateway_child(config, tmp_path, log) as (base, _),
        Client(f"{base}/mcp", mode="legacy") as client,
    ):
        asked = await client.call_tool("faulty__asks", {"count": 40})
    assert text_of(asked) == "40"
    lines = [line for line in log.read_text().splitlines() if "elicitation/create from faulty" in line]
    assert len(lines) in (1, 2), lines  # 2: the questions took past a 10 s window
