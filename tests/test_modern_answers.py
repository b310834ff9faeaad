"""How the gateway answers a modern-era POST (``compat/modern.py``), read off the wire: a call
that sends nothing before its result gets one JSON body; one that reports progress commits
``text/event-stream``, its progress under the client's own token before the result; a client
that hangs up cancels the call; anything else is answered by the SDK's own entry, as before.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp_types as types

from tests.servers import recorder
from tests.support import Seen, running_gateway, serving_upstream

BOUND = 10.0
VERSION = "2026-07-28"


@asynccontextmanager
async def gateway(seen: Callable[[dict[str, Any]], None] = lambda _: None) -> AsyncIterator[str]:
    async with (
        serving_upstream(recorder.build(seen)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}}) as gw,
    ):
        yield gw.url


def post(name: str, arguments: dict[str, Any], **meta: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """A modern-era ``tools/call`` of ``name``: its headers and body."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    envelope = {types.PROTOCOL_VERSION_META_KEY: VERSION, types.CLIENT_CAPABILITIES_META_KEY: {}}
    params = {"name": name, "arguments": arguments, "_meta": {**envelope, **meta}}
    return headers, {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_silent_call_is_one_json_body_and_one_reporting_progress_a_stream() -> None:
    async with gateway() as url, httpx.AsyncClient(timeout=BOUND) as http:
        headers, body = post("rec__tally", {"by": 2})
        silent = await http.post(url, headers=headers, json=body)
        headers, body = post("rec__steps", {"count": 2}, progressToken="mine")
        streamed = await http.post(url, headers=headers, json=body)
    assert silent.status_code == 200
    assert silent.headers["content-type"] == "application/json"
    answer = silent.json()
    assert (answer["id"], answer["result"]["structuredContent"]) == (7, {"result": 2})
    assert answer["result"]["resultType"] == "complete"  # the SDK's runner shaped it
    assert streamed.headers["content-type"] == "text/event-stream"
    messages = events(streamed.text)
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert [(p["progressToken"], p["progress"]) for p in progress] == [("mine", 1.0), ("mine", 2.0)]
    assert messages[-1]["id"] == 7
    assert not messages[-1]["result"].get("isError")


async def test_a_client_that_hangs_up_cancels_its_call_upstream() -> None:
    seen = Seen()
    async with gateway(seen) as url, httpx.AsyncClient(timeout=BOUND) as http:
        headers, body = post("rec__wait", {"seconds": 60})

        async def call() -> None:
            await http.post(url, headers=headers, json=body)

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await seen.first("started")
                tg.cancel_scope.cancel()  # the POST's connection is closed
            await seen.first("handler_cancelled")


async def test_what_is_not_a_plain_request_is_answered_by_the_sdks_entry() -> None:
    async with gateway() as url, httpx.AsyncClient(timeout=BOUND) as http:
        headers, body = post("rec__tally", {"by": 2})
        mismatched = await http.post(url, headers={**headers, "Mcp-Name": "rec__other"}, json=body)
        notified = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/x"})
        batch = await http.post(url, headers=headers, json=[body])
    assert mismatched.status_code == 400
    assert mismatched.json()["error"]["code"] == types.HEADER_MISMATCH
    assert notified.status_code == 202
    assert batch.json()["error"]["code"] == types.INVALID_REQUEST
