"""A handshake-era client whose dedicated (``per_client``) upstream re-reads its roots on
each ``notifications/roots/list_changed`` (as server-everything does), and that never
answers ``roots/list`` (here: it opens no GET stream, which the spec makes optional, so the
SDK drops the request): each notification left one relay waiting in the gateway for ever,
so one client grew the gateway's tasks without bound with notifications. Found by a
helper's attack (stop 50).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import httpx

from agent_gateway.downstream.input_requests import MAX_WAITING
from tests.support import running_gateway

HERE = Path(__file__).resolve().parent.parent / "servers"
MANY = 200
BOUND = 25.0
HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


async def _post(http: httpx.AsyncClient, url: str, body: dict, session: str | None = None) -> httpx.Response:
    headers = dict(HEADERS)
    if session is not None:
        headers["Mcp-Session-Id"] = session
        headers["MCP-Protocol-Version"] = "2025-11-25"
    return await http.post(url, json=body, headers=headers)


def _asked(log: Path) -> int:
    return log.read_text().splitlines().count("asked") if log.exists() else 0


async def test_unanswered_roots_requests_do_not_pile_up_in_the_gateway(tmp_path: Path) -> None:
    log = tmp_path / "roots.log"
    upstream = {
        "command": sys.executable,
        "args": [str(HERE / "roots_asker.py"), str(log)],
        "session": "per_client",
        "protocol": "legacy",  # as server-everything speaks
    }
    info = {"protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": True}}}
    opening = {"clientInfo": {"name": "never-answers", "version": "0"}, **info}
    async with (
        running_gateway({"upstreams": {"r": upstream}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        init = await _post(
            http, gw.url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": opening}
        )
        session = init.headers["mcp-session-id"]
        await _post(http, gw.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "r__noop", "arguments": {}},
        }
        called = await _post(http, gw.url, call, session)  # its dedicated upstream session is up
        for _ in range(MANY):
            changed = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
            assert (await _post(http, gw.url, changed, session)).status_code == 202
        # The upstream's questions past the client's bound are answered at once (an error):
        # before, every one waited in the gateway for an answer that never came.
        with anyio.fail_after(BOUND):
            while _answered(log) < MANY - MAX_WAITING:
                await anyio.sleep(0.05)
    assert "ok" in called.text, called.text
    assert _asked(log) == MANY


def _answered(log: Path) -> int:
    return sum(line.startswith("answered") for line in log.read_text().splitlines()) if log.exists() else 0
