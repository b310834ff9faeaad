"""What a client request is for, read once per request by ``request_wrapper``: the name (or
URI) it targets, the arguments it passes, and the upstream it goes to; its span, metric and
call record all take it from here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

UpstreamOf = Callable[[str, str], str | None]
"""(method, target) -> the upstream a request for ``target`` goes to, or None."""


@dataclass(frozen=True, slots=True)
class Requested:
    """A request's target, its arguments and its upstream (None: not one of the catalog's)."""

    target: str | None
    arguments: Any
    upstream: str | None


def requested(method: str, params: Mapping[str, Any], upstream_of: UpstreamOf, via: str | None) -> Requested:
    """What a ``method`` request with ``params`` is for; a call of ``via`` (``call_tool``) is
    for the tool it calls, with that tool's arguments, as a direct call is."""
    target, arguments = called(method, params, via)
    return Requested(target, arguments, upstream_of(method, target) if target is not None else None)


def called(method: str, params: Mapping[str, Any], via: str | None = None) -> tuple[str | None, Any]:
    """The name (or URI) a request is for, and the arguments it passes: for a call of ``via``
    (``call_tool``), the tool it calls and that tool's arguments, as a direct call has them."""
    key = "uri" if method in ("resources/read", "resources/subscribe", "resources/unsubscribe") else "name"
    value, arguments = params.get(key), params.get("arguments")
    if via is not None and method == "tools/call" and value == via and isinstance(arguments, Mapping):
        inner: Mapping[str, Any] = arguments  # pyright: ignore[reportUnknownVariableType]
        if isinstance(name := inner.get("name"), str):
            return name, inner.get("arguments")
    return (value if isinstance(value, str) else None), arguments
