"""The members of uvicorn's httptools protocol the listener's bounds ride on still exist
(``agent_gateway.listener``): an upgrade that renames one fails here, not silently."""

from __future__ import annotations

import inspect

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@pytest.mark.parametrize(
    "member", ["connection_made", "connection_lost", "on_headers_complete", "on_response_complete"]
)
def test_uvicorns_protocol_has_each_method_the_listener_overrides(member: str) -> None:
    assert callable(getattr(HttpToolsProtocol, member, None)), f"uvicorn: HttpToolsProtocol.{member} is gone"


def test_uvicorns_protocol_keeps_the_transport_the_listener_closes() -> None:
    source = inspect.getsource(HttpToolsProtocol.connection_made)
    assert "self.transport = transport" in source, "uvicorn: the protocol no longer keeps its transport"
