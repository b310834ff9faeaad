"""Which ``_meta`` keys cross the gateway: of a client's request, the client's own; of an
upstream's result, all but those that describe the upstream itself.

A client's own key is a prefixed one (``example.com/key``, ``claudecode/toolUseId``) whose
prefix nobody reserves: MCP reserves a prefix with ``modelcontextprotocol`` or ``mcp`` among
its labels (``io.modelcontextprotocol/``, ``dev.mcp/``), the gateway ``io.agent-gateway/``
(the session id: a client must not name another's). A bare name is never passed on: the SDK
and FastMCP act on some (``progressToken``, and ``progress_token``, which the SDK writes
upstream as ``progressToken``, so a client could aim progress at another's call; ``fastmcp``,
which picks a tool's version the catalog never listed; ``client_id``), and the trace context
is the gateway's span's. Prefixes are compared case-blind; a key not of MCP's form is dropped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import mcp_types as types

NO_META: Mapping[str, Any] = MappingProxyType({})

SESSION_META_KEY = "io.agent-gateway/session-id"
"""The ``_meta`` key carrying the downstream session id to upstreams (``told_session``)."""

ASKER_META_KEY = "io.agent-gateway/upstream"
"""The ``_meta`` key naming, to a client, the upstream that asks it something (``upstreams/asking.py``)."""

RESULT_DROPPED = frozenset({types.SERVER_INFO_META_KEY, types.PROTOCOL_VERSION_META_KEY})
"""An upstream result's keys that describe the upstream (its serverInfo, protocol version)."""

_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_KEY = re.compile(rf"({_LABEL}(?:\.{_LABEL})*)/[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_RESERVED_LABELS = frozenset({"modelcontextprotocol", "mcp"})
_GATEWAYS = "io.agent-gateway"
_PROTOCOLS = "io.modelcontextprotocol/"


def client_meta(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """The keys of a request's ``_meta`` that are the client's own, to pass on as they are."""
    kept = {key: value for key, value in meta.items() if _clients(key)}
    return kept or NO_META


def _clients(key: str) -> bool:
    if "/" not in key or key.startswith(_PROTOCOLS):  # what every request holds, said cheaply
        return False
    matched = _KEY.fullmatch(key)
    if matched is None:
        return False
    prefix = matched[1].lower()
    return prefix != _GATEWAYS and _RESERVED_LABELS.isdisjoint(prefix.split("."))


@lru_cache(maxsize=4096)  # a session's calls share one: the hash is taken once per session, not per call
def told_session(session_id: str) -> str:
    """Downstream session ``session_id`` as upstreams are told it: the same for each of its
    calls (on any replica), another for each session, and not the id itself. A handshake-era
    HTTP client's is its ``Mcp-Session-Id``, which, without auth, is all it takes to act in
    its session: an upstream told it could end it, or send requests and answers in it."""
    told = f"agent-gateway session {session_id}".encode(errors="surrogatepass")
    return hashlib.sha256(told).hexdigest()[:32]
