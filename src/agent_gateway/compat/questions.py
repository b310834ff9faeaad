"""A question the gateway asked a handshake-era client over Streamable HTTP, failed as if the
client had answered it with an error: for an answer the gateway refused unread, past
``server.max_body_bytes`` (``request_body.py``). The error enters the session as the client's
own answer would, so the SDK resolves the waiting request with it at once.

Built of the SDK session manager's ``_server_instances`` and ``_session_owners`` and its
transport's ``_read_stream_writer``; ``tests/test_compat.py`` checks each.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    AuthorizationContext,
    authorization_context,
)
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError, RequestId
from starlette.types import Scope

from agent_gateway.access import header_of_scope
from agent_gateway.runtime import SEND_TIMEOUT

_SESSION_HEADER = b"mcp-session-id"


def credential_of(scope: Scope) -> AuthorizationContext | None:
    """The SDK's identity of the credential on a request (None: no auth): a session's owner."""
    user = scope.get("user")
    return authorization_context(user) if isinstance(user, AuthenticatedUser) else None


def session_of(manager: object, scope: Scope) -> Any | None:
    """The transport of the session the request in ``scope`` names, if this replica holds it
    for the request's credential (None: the SDK would answer "Session not found")."""
    session_id = header_of_scope(scope, _SESSION_HEADER)
    transport = getattr(manager, "_server_instances", {}).get(session_id)
    owner = getattr(manager, "_session_owners", {}).get(session_id)
    return transport if transport is not None and owner == credential_of(scope) else None


async def fail(manager: object, scope: Scope, request_id: RequestId, message: str) -> bool:
    """Answer ``request_id`` of the session the request in ``scope`` names with an error saying
    ``message``; whether it was delivered (not when the session is not this replica's, or
    another credential's: the SDK would answer that request "Session not found")."""
    transport = session_of(manager, scope)
    writer = transport._read_stream_writer if transport is not None else None  # pyright: ignore[reportPrivateUsage]
    if writer is None:
        return False
    error = JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=INVALID_REQUEST, message=message))
    with anyio.move_on_after(SEND_TIMEOUT):
        try:
            await writer.send(SessionMessage(error))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):  # the session ended meanwhile
            return False
        return True
    return False
