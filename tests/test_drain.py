"""A stop's drain (SIGTERM over HTTP) as clients and the audit trail see it, against a real
``agent-gateway serve`` process: a call still running when ``server.drain_timeout`` is up is
answered with an error saying so, in both eras, and recorded. And, in process, the answer to a
notification stream asked for once the drain has begun."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import yaml
from anyio.abc import TaskStatus

from agent_gateway.http import begin_draining, build_app
from agent_gateway.server import Gateway
from agent_gateway.serving import listener_options
from tests.support import SERVERS, config_of, free_port, ready, serving
from tests.test_cli import LEGACY, handshake, serve_process

MODERN = "2026-07-28"
WAIT = {"name": "rec__wait", "arguments": {"seconds": 3600}}


async def call_in_flight(
    url: str, era: str, answers: dict[str, dict[str, Any]], *, task_status: TaskStatus[None]
) -> None:
    """A call of ``rec__wait`` for an hour, in ``era`` over bare HTTP; started once the upstream
    reports progress (the call is in flight there); what it was answered goes in ``answers``."""
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": era}
    async with httpx.AsyncClient(timeout=None) as http:
        if era == LEGACY:
            meta: dict[str, Any] = {"progressToken": "p"}
            headers["mcp-session-id"] = await handshake(http, url)
        else:
            meta = {
                "progressToken": "p",
                types.PROTOCOL_VERSION_META_KEY: MODERN,
                types.CLIENT_CAPABILITIES_META_KEY: {},
                types.CLIENT_INFO_META_KEY: {"name": "t", "version": "1"},
            }
            headers |= {"mcp-method": "tools/call", "mcp-name": WAIT["name"]}
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": WAIT | {"_meta": meta}}
        async with http.stream("POST", url, json=call, headers=headers) as stream:
            answers[era] = {"status": stream.status_code}
            async for line in stream.aiter_lines():
                message = json.loads(line[5:]) if line.startswith("data:") else {}
                if message.get("method") == "notifications/progress":
                    task_status.started()
                elif message.get("id") == 1:
                    answers[era] |= message


async def test_a_call_still_running_when_the_drain_ends_is_answered_and_audited(tmp_path: Path) -> None:
    """Before: uvicorn cut such calls itself once ``drain_timeout`` was up: the modern client
    got a bare 500, the handshake-era one's stream ended with no answer, the log had a
    traceback per call, and the audit trail no record of most of them (they were cancelled
    after it had closed)."""
    port = free_port()
    audit = tmp_path / "audit.jsonl"
    config = {
        "server": {"port": port, "drain_timeout": 1},
        "audit": {"path": str(audit)},
        "upstreams": {"rec": {"command": sys.executable, "args": [str(SERVERS / "recorder.py")]}},
    }
    (path := tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}/mcp"
    answers: dict[str, dict[str, Any]] = {}
    log = tmp_path / "gateway.log"
    with log.open("wb") as out, serve_process(path, stderr=out) as gateway:
        await ready(port)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(call_in_flight, url, LEGACY, answers)
                await tg.start(call_in_flight, url, MODERN, answers)
                gateway.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(gateway.wait, 20) == 0
    told = "the gateway is shutting down: the call did not end within 1s"
    for era in (LEGACY, MODERN):
        assert answers[era]["status"] == 200
        assert answers[era]["error"] == {"code": types.INTERNAL_ERROR, "message": told}
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    calls = [(r["name"], r["outcome"], r["detail"]) for r in records if r["method"] == "tools/call"]
    assert calls == [("rec__wait", "error", told)] * 2
    assert "Traceback" not in log.read_text()


async def test_a_notification_stream_asked_for_while_draining_is_refused_with_a_retry_elsewhere(
    tmp_path: Path,
) -> None:
    """A GET that reaches the gateway once the drain has begun (its listener closes up to a
    tick later) is told 503, ``retry-after: 1``, and the connection closes: the client's retry
    reaches a listening replica, not this one's open connection."""
    state = {
        "audit": {"path": str(tmp_path / "audit.jsonl")},
        "agent": {"memory": {"path": str(tmp_path / "m")}},
    }
    gateway = Gateway(config_of({"upstreams": {}} | state))
    app = build_app(gateway)
    async with (
        gateway.running(),
        serving(app, **listener_options(gateway)) as base,
        httpx.AsyncClient(timeout=5) as http,
    ):
        session = await handshake(http, f"{base}/mcp")
        begin_draining(app)  # what SIGTERM's handler does (serving.py)
        headers = {"accept": "text/event-stream", "mcp-session-id": session, "mcp-protocol-version": LEGACY}
        async with http.stream("GET", f"{base}/mcp", headers=headers) as answer:
            status, told = answer.status_code, answer.headers
    assert status == 503
    assert (told.get("retry-after"), told.get("connection")) == ("1", "close")
