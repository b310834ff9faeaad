"""``GET /`` (the page), ``GET /?part=live`` (what it refreshes), ``GET /?part=catalog&q=…``
(its catalog as its search box finds it) and ``GET /?part=schema&tool=…`` (a tool's input schema,
when its row's is opened), with headers that keep anything but the page's own
style and script from running in it."""

from __future__ import annotations

import html
import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from agent_gateway.page_budget import PageBudgets
from agent_gateway.server import Gateway
from agent_gateway.ui import catalog
from agent_gateway.ui.page import StatusPage

Endpoint = Callable[[Request], Awaitable[Response]]
MAX_QUERY = 1024
"""Bytes of a query string the page reads (its own: ``part=live&catalog=N&q=…``). Parsed whole,
16,000 parameters took 9.5 ms of the event loop a request, from anyone the page lets in."""


def status_page(
    gateway: Gateway,
    authorized: Callable[[Request], bool],
    refusal: Callable[[Request], tuple[int, str]],
    budgets: PageBudgets,
) -> Endpoint:
    """The page's endpoint; ``authorized(request)`` is the same check as ``/status``, and
    ``refusal(request)`` the same answer when it fails (its status and reason); each answer
    charged to its client's budget, shared with ``/status`` and ``/metrics``."""
    rendered = StatusPage(gateway)

    async def page(request: Request) -> Response:
        if not authorized(request):
            status, reason = refusal(request)
            return HTMLResponse(f"<h1>{status}: {html.escape(reason)}</h1>", status_code=status)
        if len(request.scope["query_string"]) > MAX_QUERY:
            return HTMLResponse(f"<h1>414: a query string over {MAX_QUERY} bytes</h1>", status_code=414)
        if (over := await budgets.refusal(request.scope, "the status page")) is not None:
            why, seconds = over
            headers = {"Retry-After": str(seconds)}
            return HTMLResponse(f"<h1>429: {html.escape(why)}</h1>", status_code=429, headers=headers)
        part, query = request.query_params.get("part"), request.query_params.get("q")
        nonce, looked = None, 0
        if part == "live":
            body, looked = await rendered.live(request.query_params.get("catalog"), query)
        elif part == "catalog":
            body, looked = await rendered.search(query)
        elif part == "schema":
            if (schema := rendered.schema(request.query_params.get("tool"))) is None:
                return _answer(b"no such tool", None, status=404, media="text/plain")
            budgets.charge(request.scope, len(schema))
            return _answer(schema, None, media="text/plain")
        else:
            nonce = secrets.token_urlsafe(16)
            body = rendered.full(nonce)
        budgets.charge(request.scope, max(len(body), looked * catalog.LOOKED_AT))
        return _answer(body, nonce)

    return page


def _answer(body: bytes, nonce: str | None, status: int = 200, media: str = "text/html") -> Response:
    """``body``, as ``media`` (a schema as plain text: an upstream's, shown as text, never markup)."""
    source = f"'nonce-{nonce}'" if nonce else "'none'"
    return Response(
        body,
        status_code=status,
        media_type=media,
        headers={
            "Content-Security-Policy": (
                f"default-src 'none'; style-src {source}; script-src {source}; connect-src 'self'; "
                "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
            ),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )
