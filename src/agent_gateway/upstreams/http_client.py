"""The HTTP client of a Streamable HTTP upstream (httpx2's, on ``http_transport.py``'s
aiohttp wire), its cookies bounded, and the certificates it trusts.

Apart from the wire so that naming the client costs no aiohttp (~0.16 s of a start): a
gateway whose upstreams are all stdio, as the example's and an IDE's are, never loads it.
"""

from __future__ import annotations

import ssl
import urllib.request
from http.cookiejar import Cookie, CookieJar, DefaultCookiePolicy
from typing import TYPE_CHECKING, Any

import httpx2

if TYPE_CHECKING:
    from agent_gateway.upstreams.http_transport import AiohttpTransport


class UpstreamClient(httpx2.AsyncClient):
    """httpx2's client on an ``AiohttpTransport``, which a call forwarded below the SDK's client
    posts on directly (``upstreams/forwarding.py``); its cookies bounded (``BoundedCookies``)."""

    def __init__(self, *, wire: AiohttpTransport, **options: Any) -> None:
        super().__init__(transport=wire, cookies=bounded_jar(), **options)
        self.wire = wire


def bounded_jar() -> CookieJar:
    """A cookie jar that keeps what ``BoundedCookies`` lets it (one per HTTP client)."""
    policy = BoundedCookies()
    jar = policy.jar = CookieJar(policy)
    return jar


MAX_COOKIES = 50
"""Cookies kept for one upstream: RFC 6265's least a client should keep per domain."""
MAX_COOKIE_BYTES = 4096
"""The longest cookie kept, its name and value (RFC 6265's least a client should keep)."""


class BoundedCookies(DefaultCookiePolicy):
    """httpx2's (the standard library's) cookie rules, and at most ``MAX_COOKIES`` cookies of at
    most ``MAX_COOKIE_BYTES``. The jar kept all an upstream set and sent them with every
    request, walking it each time: one setting 100 new cookies an answer took 0.85 of a core
    within 25 s, every client's calls to it slowed, and health checks carried the jar."""

    jar: CookieJar | None = None

    def set_ok(self, cookie: Cookie, request: urllib.request.Request) -> bool:
        if len(cookie.name) + len(cookie.value or "") > MAX_COOKIE_BYTES:
            return False
        jar = self.jar
        if jar is not None and len(jar) >= MAX_COOKIES and not any(_same(cookie, kept) for kept in jar):
            return False  # a cookie already kept may still be replaced
        return super().set_ok(cookie, request)


def _same(one: Cookie, other: Cookie) -> bool:
    return (one.domain, one.path, one.name) == (other.domain, other.path, other.name)


def ssl_context() -> ssl.SSLContext:
    """The certificate store httpx2 would use (certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``)."""
    return httpx2.create_ssl_context()
