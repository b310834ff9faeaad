"""A notification stream opened with a JWT ends when the token expires (``expiring_streams``):
each request is checked against its token, but a GET stream, opened once, was never asked
again: opened with a token that expired at 3 s, it was relayed resource updates at 8.7 s."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.faults.harness import text_of
from tests.security.test_token_rotation import _modern, _old_session, _read_stream, _rpc
from tests.support import python_upstream, running_gateway

SECRET = "a-shared-secret-of-at-least-32-chars!"
AUTH = {"mode": "jwt", "jwt": {"secret": SECRET, "algorithm": "HS256", "audience": "gw"}}
UPSTREAMS = {"rec": python_upstream("recorder.py", protocol="legacy")}
LIFETIME = 8
"""Seconds the short-lived client's token is valid."""
BOUND = 30.0


def token(subject: str, seconds: float) -> str:
    claims = {"sub": subject, "aud": "gw", "exp": int(time.time() + seconds)}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def bearer(subject: str, seconds: float) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(subject, seconds)}"}


async def test_a_notification_stream_ends_when_its_token_expires_and_the_session_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent_gateway.refusals")
    send, seen = anyio.create_memory_object_stream[str](8)
    async with (
        running_gateway({"upstreams": UPSTREAMS, "auth": AUTH}) as gw,
        httpx2.AsyncClient(headers=bearer("long", 600)) as long_http,
        Client(streamable_http_client(gw.url, http_client=long_http), mode="legacy") as bystander,  # type: ignore[arg-type]
        _old_session(gw.url, bearer("short", LIFETIME)["Authorization"]) as (short, headers),
        anyio.create_task_group() as tg,
        seen,
    ):
        await tg.start(_read_stream, short, gw.url, headers, send)
        await bystander.call_tool("rec__updates", {"uri": "note://x", "times": 1})
        with anyio.fail_after(BOUND):
            assert await seen.receive() == "update"  # relayed while the token is valid
            assert await seen.receive() == "end"  # cut at its expiry
        result = await bystander.call_tool("rec__updates", {"uri": "note://x", "times": 1})
        assert text_of(result) == "1"  # the bystander served throughout
        # The session goes on: its client, with a fresh token, calls on in it.
        fresh: dict[str, Any] = {**headers, **bearer("short", 600)}
        call = {"name": "rec__updates", "arguments": {"uri": "note://y", "times": 0}}
        served = await short.post(gw.url, json=_rpc(2, "tools/call", call), headers=fresh)
        assert served.status_code == 200, served.text
        assert '"isError":false' in served.text.replace(" ", ""), served.text
        expired = await short.post(gw.url, json=_rpc(3, "ping", {}), headers=headers)
        assert expired.status_code == 401  # its own token, past its exp
    said = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.refusals"]
    assert said == ["client short's notification stream ended: its token expired"], said


async def _listen(c: Client, heard: MemoryObjectSendStream[str], *, task_status: TaskStatus[None]) -> None:
    """``c``'s listen stream: "changed" for each tools list change heard, then "end" (ended
    or failed)."""
    async with heard:
        try:
            async with c.listen(tools_list_changed=True) as subscription:
                task_status.started()
                async for _ in subscription:
                    await heard.send("changed")
        except Exception as exc:  # cut: its client tells how
            await heard.send(f"end ({type(exc).__name__})")
            return
        await heard.send("end")


async def test_a_modern_listen_stream_ends_when_its_token_expires_and_another_hears_on() -> None:
    short_sent, short_heard = anyio.create_memory_object_stream[str](8)
    long_sent, long_heard = anyio.create_memory_object_stream[str](8)
    noisy = {"noisy": python_upstream("noisy.py")}
    async with (
        running_gateway({"upstreams": noisy, "auth": AUTH}) as gw,
        _modern(gw.url, token("short", LIFETIME)) as short,
        _modern(gw.url, token("long", 600)) as long,
        anyio.create_task_group() as tg,
        short_heard,
        long_heard,
    ):
        await tg.start(_listen, short, short_sent)
        await tg.start(_listen, long, long_sent)
        with anyio.fail_after(BOUND):
            ended = await short_heard.receive()  # at the short token's exp
        assert ended.startswith("end"), ended
        assert text_of(await long.call_tool("noisy__churn", {"times": 1})) == "churn"  # a list change
        with anyio.fail_after(BOUND):
            assert await long_heard.receive() == "changed"  # the other client's stream hears it
        tg.cancel_scope.cancel()
