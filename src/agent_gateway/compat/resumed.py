"""An upstream's handshake-era Streamable HTTP session resumed by its id: what lets a
replica that adopts a client's session reuse the dedicated (``per_client``) upstream session
another replica opened for it, instead of losing what the upstream keeps in it.

The SDK's client learns a session's id only from its ``initialize`` answer, and ends the
session (DELETE) whenever its transport closes. ``http_session`` is the SDK's own
``streamable_http_client`` (the same transport, streams and tasks) with the id set before
the first request, its notification stream opened at once (the SDK opens it after
``notifications/initialized``, which a resumed session does not send again), and the DELETE
sent only when asked: a replica shutting down must not end a session another replica
serves. ``resumed_client`` is the SDK's ``Client`` with the recorded ``InitializeResult``
installed through the session's public ``adopt`` before ``initialize``, which then returns
at once without a request.

It lives in ``compat/`` because it is built of the SDK's private stream helpers
(``mcp.shared._context_streams``, ``mcp.shared._compat``) and ``Client._build_session``;
``tests/test_compat.py`` checks each.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.shared._compat import resync_tracer
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from agent_gateway.compat.http_streams import BoundedTransport
from agent_gateway.compat.mcp import TransportStreams

logger = logging.getLogger(__name__)

_END_TIMEOUT = 2.0
"""Seconds the DELETE that ends a session upstream may take as its transport closes."""


@dataclass
class HttpSession:
    """One upstream Streamable HTTP session as this replica holds it: the id of one to
    resume (another replica opened it), and, once connected, the transport that knows its id."""

    resume_id: str | None = None
    kept: bool = False
    """Left open upstream when this replica closes its transport (other replicas may serve
    it); ended then (the SDK's way) otherwise."""
    transport: StreamableHTTPTransport | None = None
    client: httpx2.AsyncClient | None = None

    @property
    def session_id(self) -> str | None:
        """The upstream's id of the session (None: not connected, or the upstream gives none)."""
        return self.transport.session_id if self.transport is not None else None

    async def end(self) -> None:
        """End the session upstream (DELETE); its owner's client ended its own session."""
        if self.transport is not None and self.client is not None and self.session_id:
            await self.transport.terminate_session(self.client)


@asynccontextmanager
async def http_session(
    url: str, http_client: httpx2.AsyncClient, max_sse_event_size: int | None, link: HttpSession, label: str
) -> AsyncIterator[TransportStreams]:
    """The SDK's Streamable HTTP client transport (its streams bounded: ``http_streams.py``),
    holding ``link``'s session (see above); ``label``: the upstream session, as warnings name it."""
    transport = BoundedTransport(url, max_sse_event_size=max_sse_event_size)
    transport.floored(http_client, label)
    transport.session_id = link.resume_id
    link.transport, link.client = transport, http_client
    read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_reader = create_context_streams[SessionMessage](0)
    async with read_writer, read_stream, write_stream, write_reader, anyio.create_task_group() as tg:

        def start_get_stream() -> None:
            tg.start_soon(transport.handle_get_stream, http_client, read_writer)

        tg.start_soon(
            transport.post_writer, http_client, write_reader, read_writer, write_stream, start_get_stream, tg
        )
        if link.resume_id is not None:
            start_get_stream()
        try:
            yield read_stream, write_stream
        finally:
            if not link.kept:  # shielded: closed by a cancel (the gateway stopping), it sent none
                with anyio.CancelScope(shield=True), anyio.move_on_after(_END_TIMEOUT):
                    await link.end()
            tg.cancel_scope.cancel()
    await resync_tracer()


@dataclass
class _ResumedClient(Client):
    resumed: types.InitializeResult | None = field(default=None, kw_only=True)

    async def _build_session(self, exit_stack: Any) -> ClientSession:
        session = await super()._build_session(exit_stack)
        if self.resumed is not None:
            session.adopt(self.resumed)  # initialize() then returns it, sending nothing
        return session


def resumed_client(result: types.InitializeResult, **options: Any) -> Client:
    """An ``mcp.Client`` (``options`` as for ``Client``, ``mode`` legacy) whose handshake is
    ``result``, recorded when the session was opened: entering it sends nothing."""
    return _ResumedClient(mode="legacy", resumed=result, **options)
