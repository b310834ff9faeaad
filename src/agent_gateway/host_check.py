"""The Host and Origin checks, exact (DNS rebinding, and pages on other local ports).

FastMCP's guard compares only what is left of a Host header once its last ``:…`` is cut,
so ``127.0.0.1:9200.evil.com`` and ``127.0.0.1:9200@evil.com`` pass as loopback, and it
takes any loopback Origin whatever its port, so a page served by another program on
``localhost:3000`` may call the gateway. This check runs in front of it, on every route:

- a Host header must be ``name`` or ``name:port`` (a DNS name, an IPv4 address or a
  bracketed IPv6 one; the port digits only), and a loopback name's port must be the port the
  request came in on;
- an Origin must be one of ``server.allowed_origins`` or the request's own origin exactly
  (scheme, host and port).

Anything else gets 421 (Host) or 403 (Origin), before any route runs.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_gateway.refusals import refused

_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::(\d{1,5}))?$")
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})


def host_problem(host: str, bound_port: int | None) -> str | None:
    """Why a Host header value is refused, or None."""
    match = _HOST.match(host)
    if match is None:
        return "malformed Host header"
    name, port = match.group(1).lower(), match.group(2)
    if name in _LOOPBACK and port is not None and bound_port is not None and int(port) != bound_port:
        return f"Host names port {port}, the request came in on {bound_port}"
    return None


def origin_allowed(origin: str, scheme: str, host: str, allowed: Sequence[str]) -> bool:
    """Whether a browser page at ``origin`` may call: listed, or the request's own origin."""
    wanted = origin.strip().lower().rstrip("/")
    if any(pattern == "*" or fnmatch.fnmatchcase(wanted, pattern.lower().rstrip("/")) for pattern in allowed):
        return True
    return (
        wanted == f"{scheme}://{host.lower()}"
        or wanted == f"{scheme}://{_without_default_port(scheme, host)}"
    )


def _without_default_port(scheme: str, host: str) -> str:
    default = ":443" if scheme == "https" else ":80"
    return host.lower().removesuffix(default)


class HostCheck:
    """ASGI middleware: the exact Host and Origin checks (see the module docstring)."""

    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str]) -> None:
        self.app = app
        self.allowed_origins = tuple(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = ""
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        server = scope.get("server")
        bound = int(server[1]) if server and server[1] is not None else None
        if (problem := host_problem(host, bound)) is not None:
            refused("host", "refused a request: %s (%r)", problem, host)
            await _answer(send, 421, b"Misdirected Request")
            return
        if origin and not origin_allowed(origin, scope.get("scheme", "http"), host, self.allowed_origins):
            refused("origin", "refused a request from Origin %r", origin)
            await _answer(send, 403, b"Forbidden Origin")
            return
        await self.app(scope, receive, send)


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
