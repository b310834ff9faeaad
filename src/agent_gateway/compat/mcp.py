"""The ``mcp`` SDK's internals the gateway uses (verified against mcp 2.3.0)."""

from __future__ import annotations

from typing import Any

import msgspec
from mcp.client import streamable_http
from mcp.client._transport import TransportStreams
from mcp.server.connection import Connection
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, create_mcp_http_client
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter

__all__ = [
    "MCP_DEFAULT_SSE_READ_TIMEOUT",
    "MCP_DEFAULT_TIMEOUT",
    "ReadStream",
    "TransportStreams",
    "WriteStream",
    "connection_of",
    "create_mcp_http_client",
    "lean_client_parsing",
    "parse_message",
]


def connection_of(session: Any) -> Connection:
    """The ``Connection`` behind a ``ServerSession`` (its per-connection ``state`` and
    notification senders), which the SDK keeps private."""
    connection: Connection = session._connection  # pyright: ignore[reportPrivateUsage]
    return connection


def parse_message(data: bytes | str) -> JSONRPCMessage:
    """One JSON-RPC message, as ``jsonrpc_message_adapter.validate_json`` reads it, in a
    quarter of the memory. pydantic's own JSON parser holds three to four times a message's
    size at its peak (an 80 MB answer: +320 MB); msgspec makes the Python objects straight
    from the bytes (+80 MB), and pydantic validates them keeping their strings. What msgspec
    refuses (bad JSON, bad UTF-8) is left to pydantic, which raises its own error for it.
    """
    try:
        decoded = _decode(data)
    except ValueError:  # msgspec's DecodeError, or bad UTF-8 (UnicodeDecodeError)
        return jsonrpc_message_adapter.validate_json(data, by_name=False)
    return jsonrpc_message_adapter.validate_python(decoded, by_name=False)


_decode = msgspec.json.Decoder().decode


class _LeanAdapter:
    """``jsonrpc_message_adapter`` as the SDK's Streamable HTTP client calls it."""

    def validate_json(self, data: bytes | str, *, by_name: bool = False) -> JSONRPCMessage:
        assert not by_name, "the SDK reads messages by alias"
        return parse_message(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(jsonrpc_message_adapter, name)


def lean_client_parsing() -> None:
    """Make the SDK's Streamable HTTP client (the gateway's, to its upstreams) parse every
    answer and event with ``parse_message``. The client reads the module's
    ``jsonrpc_message_adapter`` at each message (``tests/test_compat.py`` checks); the SDK
    has no parser to pass. Idempotent."""
    streamable_http.jsonrpc_message_adapter = _LeanAdapter()  # type: ignore[assignment]
