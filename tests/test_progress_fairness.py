"""A client that reads nothing of its answer holds up only its own progress reports and log
lines: another client's, on the same shared upstream session, are passed on in full."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from tests.replicas.test_store import ACCEPT, opened
from tests.test_proxying import BOUND, recorded_gateway

PAD = "x" * 60_000
"""Characters after each of the stuck client's reports: a few hundred fill the sockets to it."""
STEPS = 300


def unread_call(url: str, headers: dict[str, str]) -> socket.socket:
    """A ``tools/call`` of ``rec__steps`` asking for progress, sent on a socket never read."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    params = {
        "name": "rec__steps",
        "arguments": {"count": STEPS, "pad": PAD},
        "_meta": {"progressToken": "stuck"},
    }
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}).encode()
    fields = {**headers, "Host": f"{host}:{port}", "Content-Type": "application/json"}
    head = "POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


async def test_a_client_reading_nothing_does_not_silence_another_clients_progress(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(progress)

    async with (
        recorded_gateway("http", tmp_path, protocol="legacy") as (gw, _),
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        stuck = unread_call(gw.url, {**ACCEPT, **await opened(http, gw.url)})
        try:
            with anyio.fail_after(BOUND):  # its reports pile up, its call upstream ends
                while "progress from rec dropped" not in caplog.text or gw.gateway.status()["pending_calls"]:
                    await anyio.sleep(0.05)
            async with Client(gw.url, mode="legacy") as other:
                result = await other.call_tool("rec__steps", {"count": 5}, progress_callback=on_progress)
                with anyio.move_on_after(BOUND):
                    while len(received) < 5:
                        await anyio.sleep(0.01)
        finally:
            stuck.close()
    assert not result.is_error
    assert received == [1.0, 2.0, 3.0, 4.0, 5.0]  # before: none, the stuck client's held every slot
