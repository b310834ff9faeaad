"""A notification stream (an MCP ``GET``, or a modern-era ``subscriptions/listen``) ends when
the token it was opened with expires.

Each request is checked against its token, but a stream opened once is never asked again:
opened with a JWT that expired at 3 s, a ``GET`` stream went on relaying resource updates and
log lines at 8.7 s, and would for as long as its client kept it open, however short-lived the
tokens its issuer grants. Now the stream is cut at the token's ``exp``; its client opens
another with the token it holds then (a fresh one is served, an expired one refused 401). The
session itself is kept: a client refreshing its token loses nothing but the stream's reconnect.
Calls in flight are not cut (they were admitted under the token; each has its ``timeout``).
"""

from __future__ import annotations

import logging
import time

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.access import token_of_scope
from agent_gateway.limits import PARSED
from agent_gateway.refusals import refused


class ExpiringStreams:
    """ASGI middleware (after admission): a notification stream opened with a token that has
    an ``exp`` is served until then."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = token_of_scope(scope) if scope["type"] == "http" and _streams(scope) else None
        if token is None or token.expires_at is None:
            await self.app(scope, receive, send)
            return
        streaming = False  # a response begun and not ended (its body may be written past this send)

        async def sending(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                streaming = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                streaming = False
            await send(message)

        with anyio.move_on_after(token.expires_at - time.time()) as cut:
            await self.app(scope, receive, sending)
        if not cut.cancelled_caught:
            return
        who = token.client_id  # its subject, or a static token's name
        refused("token_expired", "client %s's notification stream ended: its token expired", who,
                level=logging.INFO, peer=who)  # fmt: skip
        if streaming:  # ended as a stream ends, not cut (uvicorn's ERROR for a response left open)
            with anyio.move_on_after(_END_TIMEOUT, shield=True):
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def _streams(scope: Scope) -> bool:
    """Whether the request opens a notification stream: a ``GET``, or a modern-era
    ``subscriptions/listen`` (its body as admission parsed it)."""
    if scope["method"] == "GET":
        return True
    parsed = scope.get(PARSED)
    return parsed is not None and parsed[1].get("method") == "subscriptions/listen"


_END_TIMEOUT = 2.0
"""Seconds the end of a cut stream may take to write (a client not reading: its connection
closed then, as any)."""
