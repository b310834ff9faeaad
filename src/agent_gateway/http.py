"""The Starlette app: the MCP endpoint plus ``/healthz``, ``/readyz``, ``/status``, ``/metrics``
and the status page at ``/``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

import anyio
import msgspec
from fastmcp.server.http import StreamableHTTPASGIApp
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.connection import Connection
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Lifespan, Receive, Scope, Send

from agent_gateway.access import token_of_scope
from agent_gateway.authentication import keys_of, secret_of
from agent_gateway.call_records import admission_refusals
from agent_gateway.compat.adoption import adopt_sessions
from agent_gateway.compat.deferred import DeferredSessionManager, defer_responses
from agent_gateway.config import GatewayConfig
from agent_gateway.cors import cross_origin
from agent_gateway.downstream.room import Room
from agent_gateway.errors import KeysUnavailable
from agent_gateway.expiring_streams import ExpiringStreams
from agent_gateway.exporters import installed
from agent_gateway.host_check import HostCheck
from agent_gateway.in_flight import Outflow
from agent_gateway.limits import Admission, Bounds
from agent_gateway.over_limits import refuse
from agent_gateway.page_budget import PageBudgets
from agent_gateway.refusals import refused
from agent_gateway.rendered import Rendered
from agent_gateway.server import Gateway
from agent_gateway.store.record import SessionRecord
from agent_gateway.ui import status_page

logger = logging.getLogger(__name__)


def build_app(gateway: Gateway) -> Starlette:
    """An ASGI app serving ``gateway``, which the caller runs (``async with gateway.running()``)."""
    server = gateway.config.server
    shared = gateway.shared
    room = Room(
        gateway.sessions.handshake_sessions, server.max_sessions, shared.room if shared is not None else None
    )
    # Host and Origin are checked on every request (DNS rebinding), by HostCheck, in place of
    # FastMCP's guard: loopback names and the bound address always pass; anything else must be
    # listed in server.allowed_hosts ("*" passes any Host; Origin is still checked).
    mcp_app = gateway.server.http_app(
        path=server.path,
        session_idle_timeout=server.session_idle_timeout,
        host_origin_protection=False,
        # With a shared store, a dropped SSE stream resumes (Last-Event-ID) on any replica.
        event_store=shared.events if shared is not None else None,
        middleware=[
            Middleware(
                HostCheck,
                allowed_origins=list(server.allowed_origins),
                allowed_hosts=list(server.allowed_hosts),
                listen_host=server.host,
            ),
            *cross_origin(server.allowed_origins),  # behind the Origin check: listed pages only
            Middleware(
                Admission,
                access=gateway.access,
                bounds=_bounds(gateway),
                on_refused=admission_refusals(gateway.activity),
                shared=shared.limits if shared is not None else None,
                room=room,
            ),
            Middleware(ExpiringStreams),
            Middleware(Outflow),
            Middleware(DirectRoute, path=server.path),
        ],
    )

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    minimal = public_health(gateway.config) == "minimal"

    async def readyz(_: Request) -> JSONResponse:
        ready, body = readiness(gateway)
        return JSONResponse(body, status_code=200 if ready else 503)

    def authorized(request: Request) -> bool:
        # Upstream hosts, errors and every client's calls: for admin clients when auth is on.
        if gateway.config.auth.mode == "none":
            return True
        token = token_of_scope(request.scope)
        return token is not None and gateway.access.principal(token).policy.admin

    def not_admin(request: Request) -> JSONResponse:
        status, reason = admin_refusal(request)
        return JSONResponse({"error": reason}, status_code=status)

    counts = Rendered("/status", lambda: msgspec.json.encode(gateway.status()))
    metrics = Rendered("/metrics", partial(generate_latest, REGISTRY))

    budgets = PageBudgets(gateway.access, server.page_bytes_per_second)

    async def status(request: Request) -> Response:
        if not authorized(request):
            return not_admin(request)
        if (over := await budgets.refusal(request.scope, "/status")) is not None:
            return over_budget(*over)
        body = counts.value()
        budgets.charge(request.scope, len(body))
        return Response(body, media_type="application/json")

    async def prometheus(request: Request) -> Response:
        if minimal and not authorized(request):
            return not_admin(request)
        if (over := await budgets.refusal(request.scope, "/metrics")) is not None:
            return over_budget(*over)
        body = metrics.value()
        budgets.charge(request.scope, len(body))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # Added to FastMCP's own app rather than mounting it in a second Starlette app: every MCP
    # request would otherwise pass two middleware stacks and routers (~5 % of a call's CPU).
    mcp_app.router.routes[:0] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/status", status),
    ]
    if server.ui:
        mcp_app.router.routes.insert(0, Route("/", status_page(gateway, authorized, admin_refusal, budgets)))
    if (telemetry := installed()) is not None and telemetry.prometheus:
        mcp_app.router.routes.insert(0, Route("/metrics", prometheus))
    if keys_of(gateway.server.auth) is not None:
        mcp_app.add_middleware(KeysOutage)
    mcp_app.router.lifespan_context = _deferring(
        mcp_app.router.lifespan_context, _endpoint(mcp_app, server.path), gateway, room
    )
    return mcp_app


def over_budget(why: str, seconds: int) -> JSONResponse:
    """A client past its budget of pages (``page_budget.py``), told when to come back."""
    return JSONResponse({"error": why}, status_code=429, headers={"Retry-After": str(seconds)})


def admin_refusal(request: Request) -> tuple[int, str]:
    """Why a request for an admin page is refused, and its status: 403 for a client whose
    policy is not admin, 401 for one that is no client."""
    if isinstance(request.scope.get("user"), AuthenticatedUser):
        return 403, "an admin client's token is needed (policy admin: true)"
    return 401, "authentication required"


class DirectRoute:
    """ASGI middleware, the innermost: a POST to the MCP path goes straight to its route's app
    (FastMCP's endpoint, behind the auth check when auth is on), past Starlette's exception
    middleware, router and route, which would only find that same app: 1.7 % of a modern-era
    call's instructions (``bench/instructions_per_call.py``). Every other request, and a POST
    under a ``root_path``, goes through the router as before."""

    def __init__(self, app: ASGIApp, path: str) -> None:
        self.app = app
        self.path = path
        self._route: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == self.path
            and not scope.get("root_path")
        )
        route = self._route or (self._route_in(scope["app"]) if direct else None)
        await (route if direct and route is not None else self.app)(scope, receive, send)

    def _route_in(self, app: Starlette) -> ASGIApp | None:
        """The app of the route serving POSTs at the MCP path (found once: routes are fixed
        before the first request)."""
        for route in app.router.routes:
            if not isinstance(route, Route) or route.path != self.path:
                continue
            if route.methods is None or "POST" in route.methods:  # None: any method (no auth)
                self._route = route.app
                break  # the router takes the first match too
        return self._route


def readiness(gateway: Gateway, *, starting: bool = False) -> tuple[bool, dict[str, Any]]:
    """Whether ``gateway`` is ready, and what ``/readyz`` says of it: every upstream's state
    (only whether it is ready when ``public_health`` is minimal). While ``starting``
    (``starting.py``) it is not, whatever its upstreams' states."""
    statuses = gateway.pool.statuses(gateway.catalog.problems)
    missing = [s.as_dict() for s in statuses if not s.serving]
    problems = gateway.unready()
    if (keys := keys_of(gateway.server.auth)) is not None and (problem := keys.keys_problem) is not None:
        problems.append(problem)
    ready = not starting and not missing and not problems
    body: dict[str, Any] = {"ready": ready, "starting": True} if starting else {"ready": ready}
    if public_health(gateway.config) == "full":
        body |= {"missing": missing, "problems": problems, "upstreams": [s.as_dict() for s in statuses]}
    return ready, body


def public_health(config: GatewayConfig) -> Literal["full", "minimal"]:
    """``server.public_health``; unset, ``minimal`` when auth is on: upstream hosts, errors
    and tool names are then not for anyone who can reach the port."""
    if config.server.public_health is not None:
        return config.server.public_health
    return "full" if config.auth.mode == "none" else "minimal"


def begin_draining(app: Starlette) -> None:
    """The drain begins: clients' notification streams (handshake-era ``GET`` streams, modern
    ``subscriptions/listen``) end now and new ones are refused, so their clients reconnect
    elsewhere; held open, any one kept the process up until ``server.drain_timeout``. The
    calls in flight go on, their own streams included."""
    drain: Callable[[], None] | None = getattr(app.state, "drain", None)
    if drain is not None:  # None: the app never started
        drain()


def _drain(manager: object, gateway: Gateway) -> None:
    gateway.subscriptions.close_streams()
    if isinstance(manager, DeferredSessionManager):
        manager.drain()
    logger.info("draining: clients' notification streams ended, new ones refused")


def _adopted(
    gateway: Gateway, connection: Connection, record: SessionRecord, scope: Scope
) -> Callable[[], Awaitable[None]]:
    """A session adopted from the shared store, served as the gateway's own from now on, its
    client the one the adopting request is (that request's credential opened the session)."""
    client = gateway.access.identify(Request(scope))
    return gateway.sessions.adopt(connection, record, client, secret_of(token_of_scope(scope)))


def _bounds(gateway: Gateway) -> Bounds:
    server = gateway.config.server
    return Bounds(
        body_bytes=server.max_body_bytes,
        body_timeout=server.connections.body_timeout,
        body_elements=server.max_body_elements,
        authenticated=gateway.config.auth.mode != "none",
        path=server.path,
    )


def _endpoint(app: Starlette, path: str) -> StreamableHTTPASGIApp:
    """FastMCP's MCP endpoint in ``app`` (behind its auth middleware when auth is on)."""
    for route in app.router.routes:
        if isinstance(route, Route) and route.path == path:
            endpoint = getattr(route.app, "app", route.app)  # RequireAuthMiddleware wraps it
            if isinstance(endpoint, StreamableHTTPASGIApp):
                return endpoint
    raise RuntimeError(f"FastMCP's app has no MCP endpoint at {path}")


def _deferring(
    lifespan: Lifespan[Starlette], endpoint: StreamableHTTPASGIApp, gateway: Gateway, room: Room
) -> Lifespan[Starlette]:
    """FastMCP's lifespan, with its session manager answering silent calls with JSON (and,
    with a shared store, adopting sessions that other replicas opened)."""

    @asynccontextmanager
    async def started(app: Starlette) -> AsyncIterator[None]:
        async with lifespan(app), anyio.create_task_group() as tg:
            # FastMCP makes the manager as the app starts, before any request is served.
            manager = endpoint.session_manager
            keepalives = defer_responses(manager, gateway.sessions.connection)
            room.manager = manager
            gateway.sessions.manager = manager
            app.state.drain = partial(_drain, manager, gateway)
            for keepalive in keepalives:
                tg.start_soon(keepalive.run)
            if (keys := keys_of(gateway.server.auth)) is not None:
                tg.start_soon(keys.keep_keys)
            if keepalives and (shared := gateway.shared) is not None:
                adopting = adopt_sessions(
                    manager,
                    shared.sessions,
                    shared.sessions.ended,
                    shared.events.replica,
                    gateway.take_over_subscriptions,
                    shared.keeper.lost,
                    partial(_adopted, gateway),
                    room.has_room,
                )
                if adopting is not None:
                    shared.on_session_ended(adopting.drop)
                    shared.on_notification(adopting.relay)
            yield
            tg.cancel_scope.cancel()

    return started


class KeysOutage:
    """ASGI middleware, outside FastMCP's authentication: a request whose token could not be
    checked because the identity provider's keys cannot be fetched is answered 503 with
    ``Retry-After``, the JSON-RPC error saying why, instead of the 500 the exception would
    make. Only installed with a ``jwks_url``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except KeysUnavailable as exc:  # raised before any answer began: authentication comes first
            refused("keys", "bearer token not checked: %s", str(exc))
            await refuse(send, 503, exc, [(b"retry-after", str(RETRY_AFTER).encode())])


RETRY_AFTER = 5
"""Seconds a client refused for an outage of the identity provider is told to wait."""
