"""What the gateway writes of what clients and upstreams send it: log lines neither can forge
(control characters escaped), no configured secret an upstream echoes back (in a client's
error, the log, the audit trail, the status page, ``check``), no store password in a URL's
query, metric series an upstream's error codes cannot multiply, and the caller's trace context
continued upstream while a malformed one is dropped."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import jwt
import pytest
import yaml
from fastmcp import FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import TracerProvider
from starlette.types import Scope, Send

from agent_gateway.cli import _log_handler, main  # pyright: ignore[reportPrivateUsage]
from tests.security.test_hostile_load import HEADERS, INITIALIZE
from tests.support import (
    RunningGateway,
    asgi_in_a_thread,
    gateway_process,
    intercepted,
    running_gateway,
    serving,
    serving_upstream,
)

FORGED = "2030-01-01 00:00:00.000 ERROR agent_gateway.access: FORGED admin logged in"
"""A log line of the attacker's (no comma: trace context lists split on commas)."""


async def _answer(send: Send, status: int, message: dict[str, Any]) -> None:
    """A raw JSON-RPC answer, as an upstream that is not FastMCP writes it."""
    body = json.dumps(message).encode()
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


def _echo_server() -> FastMCP:
    server = FastMCP("echo")

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


@asynccontextmanager
async def gateway(extra: dict[str, Any]) -> AsyncIterator[RunningGateway]:
    async with (
        serving_upstream(_echo_server()) as url,
        running_gateway({"upstreams": {"echo": {"url": url}}} | extra) as gw,
    ):
        yield gw


@contextmanager
def text_log(level: int = logging.INFO, form: Literal["text", "json"] = "text") -> Iterator[io.StringIO]:
    """The gateway's own log handler (``serve``'s: its filters and format), on a buffer."""
    out = io.StringIO()
    handler = _log_handler(form)
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)  # pyright: ignore[reportUnknownMemberType]
    root = logging.getLogger()
    before = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def forged_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("2030-01-01 ")]


# -- claim 4: log lines a client cannot forge ------------------------------------------------


async def test_a_rate_limited_calls_name_cannot_forge_an_access_log_line() -> None:
    limited = {"auth": {"policies": {"default": {"rate_limit": {"per_minute": 1, "burst": 1}}}}}
    async with gateway(limited) as gw, httpx.AsyncClient(timeout=10) as http:
        assert (await http.post(gw.url, json=INITIALIZE, headers=HEADERS)).status_code == 200
        # Refused before it is parsed: its name is read from the raw bytes (a raw newline in it).
        body = (
            b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo__echo\n'
            + FORGED.encode()
            + b'"}}'
        )
        with text_log() as log:
            answer = await http.post(gw.url, content=body, headers=HEADERS)
        assert answer.status_code == 429
    assert forged_lines(log.getvalue()) == [], log.getvalue()


async def _session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A handshake-era session opened with raw requests: the headers its requests carry."""
    opened = await http.post(url, json=INITIALIZE, headers=HEADERS)
    assert opened.status_code == 200
    headers = HEADERS | {
        "Mcp-Session-Id": opened.headers["mcp-session-id"],
        "Mcp-Protocol-Version": "2025-06-18",
    }
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=note, headers=headers)).status_code == 202
    return headers


def _result(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST's answer (JSON, or the one event of an SSE stream)."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in answer.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return answer.json()


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("field", ["tracestate", "baggage"])
async def test_a_clients_trace_context_in_meta_cannot_forge_a_log_line(field: str) -> None:
    hostile = {"tracestate": f"a=b,c\n{FORGED}", "baggage": f"k=v,bad entry\n{FORGED}"}[field]
    async with gateway({}) as gw, httpx.AsyncClient(timeout=10) as http:
        headers = await _session(http, gw.url)
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "echo__echo",
                "arguments": {"text": "hi"},
                "_meta": {"traceparent": TRACEPARENT, field: hostile},
            },
        }
        with text_log() as log:
            answer = await http.post(gw.url, json=call, headers=headers)
        assert _result(answer)["result"]["content"][0]["text"] == "hi"
    assert forged_lines(log.getvalue()) == [], log.getvalue()


async def told_of(call: Any) -> str:
    """What a client is told of a call: its JSON-RPC error's message, or its result's text."""
    try:
        result = await call
    except MCPError as exc:
        return exc.error.message
    return " ".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_an_upstreams_error_message_cannot_forge_a_log_line(protocol: str) -> None:
    async with serving(refusing_upstream(f"\n{FORGED}")) as base:
        config = {"upstreams": {"api": {"url": f"{base}/mcp", "protocol": protocol}}}
        with text_log() as log:
            async with running_gateway(config, settle_timeout=5):
                pass
    assert "upstream api is down: invalid credentials" in log.getvalue()
    assert forged_lines(log.getvalue()) == [], log.getvalue()


@pytest.mark.parametrize("form", ["text", "json"])
async def test_an_upstreams_error_message_cannot_break_a_log_line_with_unicode_line_breaks(form: str) -> None:
    # Python's str.splitlines (and log tools built on it) also ends a line at U+2028, U+2029
    # and U+0085; a bidirectional override makes the line read otherwise than it is.
    said = f"\u2028{FORGED}\x85{FORGED}\u2029{FORGED} \u202e"
    async with serving(refusing_upstream(said)) as base:
        config = {"upstreams": {"api": {"url": f"{base}/mcp"}}}
        with text_log(form="json" if form == "json" else "text") as log:
            async with running_gateway(config, settle_timeout=5):
                pass
    assert "upstream api is down: invalid credentials" in log.getvalue()
    assert forged_lines(log.getvalue()) == [], log.getvalue()
    assert "\u202e" not in log.getvalue()


# -- claim 1: no configured secret in what a client, the log or the audit trail is given -------

UPSTREAM_TOKEN = "upstream-secret-5f1e2d3c4b5a69788796"


def leaks(seen: dict[str, str], secret: str = UPSTREAM_TOKEN) -> dict[str, str]:
    """Where ``secret`` shows, each with the line (or 120 characters) around it."""
    found: dict[str, str] = {}
    for where, text in seen.items():
        at = text.find(secret)
        if at >= 0:
            start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
            found[where] = text[max(start, at - 120) : end if end >= 0 else len(text)][:300]
    return found


def echoing_upstream() -> Any:
    """An upstream that refuses ``tools/call`` quoting the credential it was sent, as many
    APIs do (``invalid token 'Bearer …'``): a JSON-RPC error in a 401."""
    server = FastMCP("api")
    server.tool(lambda: "never", name="lookup")

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        if request.get("method") != "tools/call":
            return False
        sent = dict(scope["headers"]).get(b"authorization", b"").decode()
        error = {"code": -32003, "message": f"invalid credentials: {sent!r}"}
        await _answer(send, 401, {"jsonrpc": "2.0", "id": request["id"], "error": error})
        return True

    return intercepted(server, intercept)


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_an_upstream_error_echoing_its_configured_header_reaches_no_client_log_or_audit(
    protocol: str, tmp_path: Path
) -> None:
    trail = tmp_path / "audit.jsonl"
    async with serving(echoing_upstream()) as base:
        upstream = {
            "url": f"{base}/mcp",
            "protocol": protocol,
            "headers": {"Authorization": "Bearer ${UPSTREAM_TOKEN}"},
        }
        config = {"upstreams": {"api": upstream}, "audit": {"path": str(trail)}}
        async with running_gateway(config, environ={"UPSTREAM_TOKEN": UPSTREAM_TOKEN}) as gw:
            with text_log() as log:
                async with Client(gw.url, mode="legacy") as client:
                    told = await told_of(client.call_tool("api__lookup", {}))
            async with httpx.AsyncClient() as http:
                status = (await http.get(f"{gw.base}/status")).text
    assert "invalid credentials" in told
    seen = {"client's error": told, "log": log.getvalue(), "/status": status, "audit": trail.read_text()}
    assert leaks(seen) == {}


# -- claim 2: bounded metric labels ----------------------------------------------------------


def coded_errors() -> Any:
    """An upstream whose every ``prompts/get`` fails with a JSON-RPC error code of its own
    choosing, a new one each time (a buggy server, or one that puts an id in the code)."""
    server = FastMCP("flaky")
    server.prompt(lambda: "never", name="brief")
    codes = iter(range(-33000, -34000, -1))

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        if request.get("method") != "prompts/get":
            return False
        error = {"code": next(codes), "message": "failed"}
        await _answer(send, 200, {"jsonrpc": "2.0", "id": request["id"], "error": error})
        return True

    return intercepted(server, intercept)


async def test_an_upstreams_error_codes_make_a_bounded_number_of_metric_series(tmp_path: Path) -> None:
    calls = 25
    async with serving(coded_errors()) as base:
        config = {"upstreams": {"flaky": {"url": f"{base}/mcp"}}}
        async with gateway_process(config, tmp_path) as gateway:
            async with Client(f"{gateway}/mcp", mode="legacy") as client:
                for _ in range(calls):
                    with pytest.raises(MCPError):
                        await client.get_prompt("flaky__brief")
            async with httpx.AsyncClient() as http:
                scraped = (await http.get(f"{gateway}/metrics")).text
    for family in (
        "mcp_server_operation_duration_seconds_count",
        "mcp_client_operation_duration_seconds_count",
    ):
        series = [line for line in scraped.splitlines() if line.startswith(family + "{")]
        types_seen = {m.group(1) for line in series if (m := re.search(r'error_type="([^"]*)"', line))}
        assert len(series) <= 3, (family, len(series), sorted(types_seen)[:5])


def refusing_upstream(said: str = "") -> Any:
    """An upstream that refuses the handshake itself, quoting the credential it was sent
    (and saying ``said`` after it)."""
    server = FastMCP("api")

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        sent = dict(scope["headers"]).get(b"authorization", b"").decode()
        error = {"code": -32003, "message": f"invalid credentials: {sent!r}{said}"}
        await _answer(send, 401, {"jsonrpc": "2.0", "id": request.get("id"), "error": error})
        return True

    return intercepted(server, intercept)


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_an_upstream_refusing_the_handshake_with_its_header_echoed_leaks_it_nowhere(
    protocol: str,
) -> None:
    async with serving(refusing_upstream()) as base:
        upstream = {
            "url": f"{base}/mcp",
            "protocol": protocol,
            "headers": {"Authorization": "Bearer ${UPSTREAM_TOKEN}"},
        }
        config = {"upstreams": {"api": upstream}}
        with text_log() as log:
            async with (
                running_gateway(config, environ={"UPSTREAM_TOKEN": UPSTREAM_TOKEN}, settle_timeout=5) as gw,
                httpx.AsyncClient() as http,
            ):
                status = (await http.get(f"{gw.base}/status")).text
                page = (await http.get(f"{gw.base}/")).text
    seen = {"log": log.getvalue(), "/status": status, "status page": page}
    assert "invalid credentials" in status, status
    assert leaks(seen) == {}


def test_check_prints_no_header_an_upstream_echoes_when_refusing_the_handshake(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with asgi_in_a_thread(refusing_upstream()) as port:
        upstream = {
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers": {"Authorization": "Bearer ${UPSTREAM_TOKEN}"},
        }
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"upstreams": {"api": upstream}, "agent": {"enabled": False}}))
        monkeypatch.setenv("UPSTREAM_TOKEN", UPSTREAM_TOKEN)
        assert main(["check", "-c", str(config)]) == 1
    out, err = capfd.readouterr()
    assert "invalid credentials" in err, err
    assert leaks({"stdout": out, "stderr": err}) == {}


# -- claim 3: the caller's trace context continued upstream, cleaned -------------------------

CARRIED = ("traceparent", "tracestate", "baggage")


def recording_upstream(seen: list[dict[str, Any]]) -> Any:
    """A FastMCP upstream (a tool, a prompt, a resource) recording, for each request, the
    trace context its ``_meta`` and its HTTP headers carried."""
    server = FastMCP("rec")
    server.tool(lambda: "hi", name="hello")
    server.prompt(lambda: "brief", name="brief")
    server.resource("memo://today")(lambda: "memo")

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        meta = (request.get("params") or {}).get("_meta") or {}
        seen.append(
            {
                "method": request.get("method"),
                "meta": {k: meta[k] for k in CARRIED if k in meta},
                "headers": {k: headers[k] for k in CARRIED if k in headers},
            }
        )
        return False

    return intercepted(server, intercept)


CALLS = {
    "tools/call": {"name": "rec__hello", "arguments": {}},
    "prompts/get": {"name": "rec__brief"},
    "resources/read": {"uri": "memo://today"},
}


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
@pytest.mark.parametrize("carrier", ["meta", "headers"])
async def test_the_callers_trace_context_reaches_the_upstream_for_every_call(
    protocol: str, carrier: str
) -> None:
    seen: list[dict[str, Any]] = []
    context = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc", "baggage": "tenant=blue"}
    async with serving(recording_upstream(seen)) as base:
        config = {"upstreams": {"rec": {"url": f"{base}/mcp", "protocol": protocol}}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
            headers = await _session(http, gw.url)
            for n, (method, params) in enumerate(CALLS.items()):
                if carrier == "meta":
                    params, extra = {**params, "_meta": context}, {}
                else:
                    extra = context
                call = {"jsonrpc": "2.0", "id": 10 + n, "method": method, "params": params}
                answer = _result(await http.post(gw.url, json=call, headers=headers | extra))
                assert "result" in answer, answer
    for method in CALLS:
        got = [s for s in seen if s["method"] == method]
        assert got, (method, seen)
        for where in ("meta", "headers"):
            sent = got[-1][where]
            assert sent.get("traceparent", "").split("-")[1:2] == [TRACEPARENT.split("-")[1]], (
                method,
                where,
                got,
            )
            assert sent.get("tracestate") == "vendor=abc", (method, where, got)
            assert sent.get("baggage") == "tenant=blue", (method, where, got)


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_a_modern_clients_trace_context_reaches_the_upstream_for_every_call(protocol: str) -> None:
    seen: list[dict[str, Any]] = []
    async with serving(recording_upstream(seen)) as base:
        config = {"upstreams": {"rec": {"url": f"{base}/mcp", "protocol": protocol}}}
        async with running_gateway(config) as gw, Client(gw.url, mode="auto") as client:
            with TracerProvider().get_tracer("tests").start_as_current_span("client request") as root:
                await client.call_tool("rec__hello", {})
                await client.get_prompt("rec__brief")
                await client.read_resource("memo://today")
    trace_id = format(root.get_span_context().trace_id, "032x")
    for method in CALLS:
        got = [s for s in seen if s["method"] == method]
        assert got, (method, seen)
        for where in ("meta", "headers"):
            assert got[-1][where].get("traceparent", "").split("-")[1:2] == [trace_id], (method, where, got)


async def test_a_refused_jwt_or_malformed_authorization_is_never_logged_or_echoed() -> None:
    from tests.security.test_identity import SECRET, token

    wrong_key = jwt.encode(
        {"aud": "gw", "sub": "bot", "exp": int(time.time()) + 300}, "k" * 40, algorithm="HS256"
    )
    presented = {
        "wrong key": wrong_key,
        "wrong audience": token(sub="bot", aud="other"),
        "expired": token(sub="bot", exp=int(time.time()) - 60),
        "no sub": token(client_id="svc"),
        "garbage": "garbage-token-Zq8XwV3kLmN0pQrS",
        "bad header": "eyJub3QganNvbg.eyJzdWIiOiJib3QifQ.c2lnbmF0dXJlLVpxOFh3VjNr",
    }
    answers: list[str] = []
    async with serving_upstream(_echo_server()) as url:
        config = {
            "upstreams": {"echo": {"url": url}},
            "auth": {"mode": "jwt", "jwt": {"secret": SECRET, "algorithm": "HS256", "audience": "gw"}},
        }
        with text_log(logging.DEBUG) as log:
            async with running_gateway(config) as gw, httpx.AsyncClient() as http:
                for bearer in presented.values():
                    for scheme in ("Bearer ", "bearer  ", "Basic ", ""):
                        headers = HEADERS | {"Authorization": f"{scheme}{bearer}"}
                        answer = await http.post(gw.url, json=INITIALIZE, headers=headers)
                        assert answer.status_code == 401, (scheme, bearer)
                        answers.append(answer.text + json.dumps(dict(answer.headers)))
    assert "bearer token refused: no sub claim" in log.getvalue()  # the verifier's lines are here
    for name, bearer in presented.items():
        signature = bearer.rsplit(".", 1)[-1]
        seen = {"log": log.getvalue(), "answers": "\n".join(answers)}
        assert leaks(seen, signature) == {}, name


STORE_PASSWORD = "store-pass-0a9b8c7d6e5f"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the refused start's streams
@pytest.mark.parametrize(
    "setting",
    [
        {"store": {"url": f"redis://127.0.0.1:1/0?password={STORE_PASSWORD}"}},
        {"store": {"url": f"redis://:{STORE_PASSWORD}@127.0.0.1:1/0"}},
        {
            "agent": {
                "memory": {
                    "store": "postgres",
                    "url": f"postgresql://gw@127.0.0.1:1/db?password={STORE_PASSWORD}",
                }
            }
        },
        {
            "agent": {
                "memory": {"store": "postgres", "url": f"postgresql://gw:{STORE_PASSWORD}@127.0.0.1:1/db"}
            }
        },
    ],
    ids=["redis query", "redis userinfo", "postgres query", "postgres userinfo"],
)
def test_check_and_the_log_show_no_store_password(
    setting: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"upstreams": {}, **setting}))
    assert main(["--log-level", "debug", "check", "-c", str(config)]) != 0
    out, err = capfd.readouterr()
    assert "127.0.0.1:1" in out + err
    assert leaks({"stdout": out, "stderr": err}, STORE_PASSWORD) == {}
