"""What a handshake-era ``GET`` carrying ``Last-Event-ID`` gets when no event store is set.

The SDK's transport hands any such GET to ``_replay_events``, which returns without an
answer when there is no store (one gateway, no ``store:``): uvicorn then sends a bare 500 and
logs ``ERROR: ASGI callable returned without starting response.``, for any client, as often
as it likes (GETs are not rate limited). The spec lets a server ignore the header (it "MAY"
replay: Streamable HTTP, "Resumability and Redelivery"), and the TypeScript SDK reads it only
when it has a store. So does this: the GET is served as it would be without the header, the
session's notification stream (or 409 while it has one). Without a store the gateway sends
no event ids, so no client of it holds one to resume from.

It lives in ``compat/`` because it overrides the transport's private ``_replay_events`` and
calls its ``_handle_get_request``; ``tests/test_compat.py`` checks both.
"""

from __future__ import annotations

import logging

from mcp.server.streamable_http import LAST_EVENT_ID_HEADER, StreamableHTTPServerTransport
from starlette.requests import Request
from starlette.types import Send

logger = logging.getLogger(__name__)

_LAST_EVENT_ID = LAST_EVENT_ID_HEADER.lower().encode("latin-1")


class ReplayFromStore(StreamableHTTPServerTransport):
    """The SDK's server transport, replaying a stream only when it has a store to replay from."""

    async def _replay_events(self, last_event_id: str, request: Request, send: Send) -> None:
        if self._event_store is not None:
            await super()._replay_events(last_event_id, request, send)
            return
        logger.debug("a GET's Last-Event-ID ignored: no event store to replay from")
        await self._handle_get_request(_without_last_event_id(request), send)


def _without_last_event_id(request: Request) -> Request:
    headers = [(name, value) for name, value in request.scope["headers"] if name != _LAST_EVENT_ID]
    return Request({**request.scope, "headers": headers}, request.receive)
