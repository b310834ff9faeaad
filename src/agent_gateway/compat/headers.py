"""A request's headers looked up in a dict: the modern lane's checks and the call's handlers
look them up a dozen times a call (``compat/exchange.py``); a ``Content-Type`` read as JSON."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope


class IndexedHeaders(Headers):
    """A request's headers, each name's first value kept in a dict. The lane's checks and
    the call's handlers look headers up a dozen times a call, and Starlette's ``Headers``
    scans and decodes the raw list at every lookup (``dict(headers)``, once per name): a
    few percent of a call's CPU (``bench/README.md``). Lookups answer as Starlette's do."""

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope=scope)
        first: dict[str, str] = {}
        seen: set[str] = set()
        self.repeated = False
        """Whether some name, in any case, is given more than once."""
        for raw_name, raw_value in self.raw:
            name = raw_name.decode("latin-1")
            first.setdefault(name, raw_value.decode("latin-1"))
            folded = name.lower()
            self.repeated = self.repeated or folded in seen
            seen.add(folded)
        self.first = first
        """Each name as the client sent it, and its first value (what ``dict(headers)`` holds)."""

    def __getitem__(self, key: str) -> str:
        try:
            return self.first[key.lower()]
        except KeyError:
            raise KeyError(key) from None

    def __contains__(self, key: Any) -> bool:
        return key.lower() in self.first


class IndexedRequest(Request):
    """A Starlette request whose headers are looked up in a dict (``IndexedHeaders``)."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        super().__init__(scope, receive)
        self._indexed = IndexedHeaders(scope)

    @property
    def headers(self) -> IndexedHeaders:
        return self._indexed


def names_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` value is ``application/json`` (parameters aside), in any case:
    media types are case-insensitive (RFC 9110 8.3.1). The SDK's handshake-era transport
    compared it case by case, and answered ``APPLICATION/JSON`` 415."""
    return any(part.strip().lower() == "application/json" for part in content_type.split(";")[0].split(","))
