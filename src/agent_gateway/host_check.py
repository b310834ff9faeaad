"""The Host and Origin checks, exact (DNS rebinding, and pages on other local ports).

FastMCP's guard compares only what is left of a Host header once its last ``:…`` is cut,
so ``127.0.0.1:9200.evil.com`` and ``127.0.0.1:9200@evil.com`` pass as loopback, and it
takes any loopback Origin whatever its port, so a page served by another program on
``localhost:3000`` may call the gateway. It also parsed a URL on every request, Origin or
not (3 % of a call's CPU). So this check replaces it, on every route:

- a Host header must be ``name`` or ``name:port`` (a DNS name, an IPv4 address or a
  bracketed IPv6 one; the port digits only), and a loopback name's port must be the port the
  request came in on;
- its name must be a loopback name, the address the server is bound to (unless that is
  ``0.0.0.0`` or ``::``), or match one of ``server.allowed_hosts`` (globs; ``*`` passes any);
- an Origin must be one of ``server.allowed_origins`` (globs, compared with the ports written
  out, as FastMCP's guard compared them) or the request's own origin exactly (scheme, host
  and port);
- there is one Host header and at most one Origin header (with two, which one counts would
  depend on which layer reads it), and, for the same reason, at most one Authorization header
  (the SDK reads the first: a proxy in front that authorized the request by its last one let
  it in as the client of another token).

Anything else gets 421 (Host), 403 (Origin) or 400 (a repeated header), before any route runs.

A request whose target is in absolute form (``POST http://evil.example/mcp HTTP/1.1``) names
its host there, and a server must take that in place of its Host header (RFC 9112 3.2.2):
the listener does (``target_authority``), so the check is of the name the request is for.
Before, the Host header alone was checked: a request for ``evil.example`` with a loopback
Host was served.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_gateway.refusals import refused

_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::(\d{1,5}))?$")
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})
_GLOB = re.compile(r"[*?\[]")


def target_authority(target: bytes) -> bytes | None:
    """The authority an absolute-form request target names (``http://a.example:80/mcp``:
    ``a.example:80``), the Host the request is for; None for a target that is a path (or
    ``*``). A target of any other form is its own authority: no Host is made of it."""
    if target.startswith(b"/") or target == b"*":
        return None
    _, found, rest = target.partition(b"://")
    authority = rest if found else target
    for end in (b"/", b"?", b"#"):
        authority = authority.split(end, 1)[0]
    return authority


def host_problem(host: str, bound_port: int | None, allowed: HostNames | None = None) -> str | None:
    """Why a Host header value is refused, or None. ``allowed``: the names it may hold
    besides loopback ones (None: any)."""
    match = _HOST.match(host)
    if match is None:
        return "malformed Host header"
    name, port = match.group(1).lower(), match.group(2)
    if name in _LOOPBACK:
        if port is not None and bound_port is not None and int(port) != bound_port:
            return f"Host names port {port}, the request came in on {bound_port}"
        return None
    if allowed is not None and not allowed.holds(name.strip("[]")):
        return "Host is not a loopback name, the bound address or one of server.allowed_hosts"
    return None


class HostNames:
    """The Host names a server accepts besides loopback ones: its bound address (unless it is
    unspecified) and ``server.allowed_hosts`` (globs, matched without their port)."""

    def __init__(self, allowed_hosts: Sequence[str], bound_address: str | None) -> None:
        patterns = [_name_of(pattern) for pattern in allowed_hosts]
        self.any = "*" in patterns
        self._exact = {p for p in patterns if not _GLOB.search(p)}
        self._globs = tuple(p for p in patterns if _GLOB.search(p))
        if bound_address is not None and not _unspecified(bound_address):
            self._exact.add(_name_of(bound_address))

    def holds(self, name: str) -> bool:
        return self.any or name in self._exact or any(fnmatch.fnmatchcase(name, p) for p in self._globs)


def _name_of(host: str) -> str:
    """A host or pattern without its port and brackets, lowercased (as FastMCP's guard read them)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _unspecified(address: str) -> bool:
    try:
        return ipaddress.ip_address(_name_of(address)).is_unspecified
    except ValueError:
        return False


def origin_allowed(origin: str, scheme: str, host: str, allowed: Sequence[str]) -> bool:
    """Whether a browser page at ``origin`` may call: listed, or the request's own origin.
    A listed pattern and the Origin are compared with their ports written out, so a glob
    over the host (``https://*.corp.test``) never runs over a port."""
    wanted = origin.strip().lower().rstrip("/")
    key = _origin_key(wanted)
    if any(pattern == "*" or fnmatch.fnmatchcase(key, _origin_key(pattern)) for pattern in allowed):
        return True
    return (
        wanted == f"{scheme}://{host.lower()}"
        or wanted == f"{scheme}://{_without_default_port(scheme, host)}"
    )


def _origin_key(origin: str) -> str:
    """``scheme://host:port``, the port written out (80, 443) as FastMCP's guard compared them;
    what is no plain origin stays as it is, lowercased."""
    text = origin.strip().lower().rstrip("/")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:  # a glob in the port ("http://localhost:*") is matched as written
        return text
    if not parts.scheme or not parts.hostname or parts.path or parts.query or parts.fragment:
        return text
    port = port if port is not None else {"http": 80, "https": 443}.get(parts.scheme)
    hostname = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{hostname}" + (f":{port}" if port is not None else "")


def _without_default_port(scheme: str, host: str) -> str:
    default = ":443" if scheme == "https" else ":80"
    return host.lower().removesuffix(default)


class HostCheck:
    """ASGI middleware: the exact Host and Origin checks (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_origins: Sequence[str],
        allowed_hosts: Sequence[str],
        listen_host: str | None = None,
    ) -> None:
        """``listen_host``: the address the server was told to listen on; when it is ``0.0.0.0``
        or ``::``, no interface a connection comes in on is the bound address (each would pass
        as a Host unlisted)."""
        self.app = app
        self.allowed_origins = tuple(allowed_origins)
        self.allowed_hosts = tuple(allowed_hosts)
        self._every_interface = listen_host is not None and _unspecified(listen_host)
        self._names: dict[str | None, HostNames] = {}
        """By bound address (a server may listen on several): built once each."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = ""
        hosts = origins = credentials = 0
        for name, value in scope["headers"]:
            if name == b"host":
                host, hosts = value.decode("latin-1"), hosts + 1
            elif name == b"origin":
                origin, origins = value.decode("latin-1"), origins + 1
            elif name == b"authorization":
                credentials += 1
        if hosts > 1 or origins > 1 or credentials > 1:  # which one counts would depend on who reads
            refused(
                "host",
                "refused a request with %d Host, %d Origin and %d Authorization headers",
                hosts,
                origins,
                credentials,
            )
            await _answer(send, 400, b"Bad Request")
            return
        server = scope.get("server")
        bound = int(server[1]) if server and server[1] is not None else None
        if (problem := host_problem(host, bound, self._allowed(server[0] if server else None))) is not None:
            refused("host", "refused a request: %s (%r)", problem, host)
            await _answer(send, 421, b"Misdirected Request")
            return
        if origin and not origin_allowed(origin, scope.get("scheme", "http"), host, self.allowed_origins):
            refused("origin", "refused a request from Origin %r", origin)
            await _answer(send, 403, b"Forbidden Origin")
            return
        await self.app(scope, receive, send)

    def _allowed(self, address: str | None) -> HostNames:
        if self._every_interface:
            address = None
        if (names := self._names.get(address)) is None:
            names = self._names[address] = HostNames(self.allowed_hosts, address)
        return names


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
