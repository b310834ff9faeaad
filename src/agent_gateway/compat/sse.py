"""The SDK's legacy SSE client (``transport: sse``), its events bounded by the upstream's
``max_message_bytes`` (verified against mcp 2.3.0).

``mcp.client.sse.sse_client`` opens its stream with ``sse_within_origin`` at that function's
default bound, 1 MiB an event, and takes no bound to pass: a 2 MiB result ended the SSE
stream, so that call failed as "connection closed", every other client's call in flight on
the upstream failed with it, and the upstream was reconnected. The client reads
``sse_within_origin`` from its module at each connection (``tests/test_compat.py`` checks),
so it is replaced there, once, by one that takes the bound of the connection being opened.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Any

import httpx2
from mcp.client import sse
from mcp.client._transport import TransportStreams
from mcp.shared._httpx_utils import sse_within_origin

_EVENT_BYTES: ContextVar[int | None] = ContextVar("sse_event_bytes", default=2**20)
"""The bound of the SSE connection being opened (the SDK's own, 1 MiB, outside one)."""


def _bounded(
    client: httpx2.AsyncClient, url: httpx2.URL | str, *, headers: dict[str, str] | None = None, **_: Any
) -> AbstractAsyncContextManager[httpx2.EventSource]:
    return sse_within_origin(client, url, headers=headers, max_event_size=_EVENT_BYTES.get())


@asynccontextmanager
async def sse_client(
    url: str,
    headers: dict[str, str],
    client_factory: Callable[..., httpx2.AsyncClient],
    max_event_bytes: int,
) -> AsyncIterator[TransportStreams]:
    """``sse.sse_client`` whose events may be ``max_event_bytes`` long each."""
    sse.sse_within_origin = _bounded  # pyright: ignore[reportPrivateImportUsage]
    token = _EVENT_BYTES.set(max_event_bytes)  # read as the client opens its stream, on entering
    try:
        async with sse.sse_client(url, headers=headers, httpx_client_factory=client_factory) as streams:
            yield streams
    finally:
        _EVENT_BYTES.reset(token)
