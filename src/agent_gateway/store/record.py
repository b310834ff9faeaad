"""A handshake-era session's record in the shared store: what a replica needs to adopt it
(``store/sessions.py`` writes and reads it), and the dedicated upstream sessions and resource
subscriptions it names."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from pydantic import ValidationError

logger = logging.getLogger(__name__)

UPSTREAM = "upstream:"
"""Record fields naming a dedicated upstream session: ``upstream:<upstream name>``."""
SUBSCRIPTION = "sub:"
"""Record fields naming the replica holding a resource subscription: ``sub:<uri>``
(``store/holders.py``)."""
READ_MOST = 1 << 20
"""Bytes of a record's fields a replica reads at once. What it writes is far less (the
``initialize`` params it keeps are at most 64 KiB); a larger value was written by something
else, and read whole it held the replica's memory and its store timeout: one 100 MB record
named by four requests took a replica from 135 to 430 MB and marked the store unavailable
(``session_find`` timed out) for every client of that replica."""
FIELDS = ("client", "owner", "params", "version", "level")
"""What ``SessionRecord.parse`` reads of a record (not its upstream sessions or subscriptions)."""
# KEYS: the record. ARGV: the most bytes, then the fields. Their values (nil: none), or their
# size when it is over the most (Redis knows each value's length without sending it).
READ = """
local size = 0
for i = 2, #ARGV do
  size = size + redis.call('HSTRLEN', KEYS[1], ARGV[i])
end
if size > tonumber(ARGV[1]) then
  return size
end
return redis.call('HMGET', KEYS[1], unpack(ARGV, 2))
"""


@dataclass(frozen=True)
class UpstreamRecord:
    """A dedicated (``per_client``) upstream session opened for a session: enough for
    another replica to resume it (a Streamable HTTP upstream in the handshake era)."""

    id: str
    """The upstream's own session id."""
    result: types.InitializeResult
    """The upstream's answer to the handshake."""

    def text(self) -> str:
        result = self.result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return json.dumps({"id": self.id, "result": result})

    @classmethod
    def parse(cls, text: str) -> UpstreamRecord | None:
        try:
            data = json.loads(text)
            return cls(str(data["id"]), types.InitializeResult.model_validate(data["result"], by_name=False))
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            logger.warning("unreadable upstream session record in the shared store (%s)", exc)
            return None


@dataclass(frozen=True)
class SessionRecord:
    """What a replica needs to adopt a handshake-era session."""

    id: str
    client: str
    """The label of the client that opened it (its subject; an anonymous client's, with its
    address): whose session count it is in, and whose requests keep it alive."""
    credential: Mapping[str, Any] | None
    """The SDK's ``AuthorizationContext`` of the credential that opened it (None: no auth);
    stored as ``owner``, the field's name in records replicas of earlier versions wrote."""
    params: types.InitializeRequestParams
    version: str
    """The negotiated protocol version."""
    level: types.LoggingLevel | None = None
    upstreams: Mapping[str, UpstreamRecord] = field(default_factory=dict[str, UpstreamRecord])
    """The dedicated upstream sessions opened for it, by upstream (written with it only when
    it is written again: ``upstream_opened`` records each as it opens)."""
    subscriptions: Mapping[str, str] = field(default_factory=dict[str, str])
    """The replica holding each of its resource subscriptions, by URI (likewise: as each is
    taken, ``store/holders.py`` records it)."""

    def fields(self) -> dict[str, str]:
        fields = {
            "client": self.client,
            "owner": json.dumps(self.credential, sort_keys=True) if self.credential is not None else "",
            "params": self.params.model_dump_json(by_alias=True, exclude_none=True),
            "version": self.version,
            "level": self.level or "",
        }
        fields |= {UPSTREAM + name: record.text() for name, record in self.upstreams.items()}
        return fields | {SUBSCRIPTION + uri: holder for uri, holder in self.subscriptions.items()}

    @classmethod
    def parse(cls, session_id: str, fields: Mapping[bytes, bytes]) -> SessionRecord | None:
        """The record in ``fields`` (a Redis hash), or None when it is not one (logged)."""
        try:
            text = {k.decode(): v.decode() for k, v in fields.items()}
            credential = json.loads(text["owner"]) if text["owner"] else None
            params = types.InitializeRequestParams.model_validate_json(text["params"], by_name=False)
            level = text.get("level") or None
            return cls(session_id, text["client"], credential, params, text["version"], level)  # pyright: ignore[reportArgumentType]
        except (KeyError, ValueError, ValidationError, UnicodeDecodeError) as exc:
            logger.warning("session %s: unreadable record in the shared store (%s)", session_id[:64], exc)
            return None
