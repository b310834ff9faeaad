"""The ``mcp`` SDK's internals the gateway uses (verified against mcp 2.3.0)."""

from __future__ import annotations

from typing import Any

from mcp.client._transport import TransportStreams
from mcp.server.connection import Connection
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, create_mcp_http_client
from mcp.shared._stream_protocols import ReadStream, WriteStream

__all__ = [
    "MCP_DEFAULT_SSE_READ_TIMEOUT",
    "MCP_DEFAULT_TIMEOUT",
    "ReadStream",
    "TransportStreams",
    "WriteStream",
    "connection_of",
    "create_mcp_http_client",
]


def connection_of(session: Any) -> Connection:
    """The ``Connection`` behind a ``ServerSession`` (its per-connection ``state`` and
    notification senders), which the SDK keeps private."""
    connection: Connection = session._connection  # pyright: ignore[reportPrivateUsage]
    return connection
