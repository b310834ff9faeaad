"""Cross-origin calls from the browser pages at ``server.allowed_origins`` (CORS).

The Origin check (``host_check.py``) lets a listed page's requests in, but a browser shows a
cross-origin answer to the page's script only if the answer says it may, and first asks
(a preflight ``OPTIONS``) before any request carrying ``Authorization``, a JSON body or the
MCP headers. Without this, a listed origin was let in and could do nothing: its preflight got
405 (401 with auth on), so a client hosted in a web page (a browser IDE) could not connect.

Starlette's ``CORSMiddleware`` answers the preflights and marks the answers, its origins
matched as the Origin check matches them (globs, ports written out). It sits behind the
Origin check, so an unlisted page is refused there (403) before it is looked at here, and
it is installed only when origins are listed: a gateway listing none answers no preflight
and pays nothing per request. A page's credentials are a bearer token it sends in
``Authorization`` (no cookies), so ``Access-Control-Allow-Credentials`` is never sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from agent_gateway.host_check import origin_allowed

METHODS = ("GET", "POST", "DELETE")
"""MCP's own over HTTP (a stream's GET, a session's DELETE)."""
EXPOSED = ("Mcp-Session-Id", "Mcp-Protocol-Version", "WWW-Authenticate", "Retry-After")
"""Answer headers a page's script must read: its session, where to authenticate, when to retry."""
MAX_AGE = 600
"""Seconds a browser may keep a preflight's answer (Chromium keeps at most 7,200)."""


class ListedOrigins(CORSMiddleware):
    """Starlette's CORS answers for the origins ``server.allowed_origins`` lists. Any request
    header is allowed (the MCP headers grow with each revision; the page is trusted by
    listing it), and a listed page on the public internet may reach a gateway on a private
    address (``Access-Control-Allow-Private-Network``: a web IDE calling one on localhost)."""

    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str]) -> None:
        super().__init__(
            app,
            allow_origins=(),  # matched by is_allowed_origin below, never by Starlette's own list
            allow_methods=METHODS,
            allow_headers=("*",),
            allow_private_network=True,
            expose_headers=EXPOSED,
            max_age=MAX_AGE,
        )
        self._allowed = tuple(allowed_origins)

    def is_allowed_origin(self, origin: str) -> bool:
        # Listed only: a page of the gateway's own origin needs no CORS answer.
        return origin_allowed(origin, "", "", self._allowed)


def cross_origin(allowed_origins: Sequence[str]) -> list[Middleware]:
    """The middleware answering listed pages' cross-origin requests, or none when none are listed."""
    return [Middleware(ListedOrigins, allowed_origins=allowed_origins)] if allowed_origins else []
