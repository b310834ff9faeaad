"""The Starlette app: the MCP endpoint plus ``/healthz``, ``/readyz`` and ``/status``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from agent_gateway.server import Gateway


def build_app(gateway: Gateway) -> Starlette:
    """An ASGI app serving ``gateway``, which the caller runs (``async with gateway.running()``)."""
    mcp_app = gateway.server.http_app(
        path=gateway.config.server.path, session_idle_timeout=gateway.config.server.session_idle_timeout
    )

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> JSONResponse:
        statuses = gateway.pool.statuses()
        missing = [s.as_dict() for s in statuses if s.state != "up"]
        body = {"ready": not missing, "missing": missing, "upstreams": [s.as_dict() for s in statuses]}
        return JSONResponse(body, status_code=200 if not missing else 503)

    async def status(_: Request) -> JSONResponse:
        return JSONResponse(gateway.status())

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # The gateway itself (upstreams, catalog) is run by the caller around the server,
        # so a start-up failure is reported once, before anything listens.
        async with mcp_app.lifespan(mcp_app):
            yield

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/status", status),
            Mount("/", app=mcp_app),
        ],
        lifespan=lifespan,
    )
