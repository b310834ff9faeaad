"""FastMCP's internals the gateway uses (verified against fastmcp 4.1.2): its low-level
``mcp`` server, where the gateway adds its middleware and its own handlers (FastMCP has no
public accessor for it; everything used on it is ``mcp``'s public API), its root
low-level middleware, which the gateway's own methods skip, and its lifespan, which stdio
serving enters itself (``run_stdio``); and its JWT verifier's fetch of the JWKS, bounded
(``BoundedJwks``)."""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any, Protocol, cast

import anyio
import httpx2
from fastmcp import FastMCP
from fastmcp.server.auth import JWTVerifier
from fastmcp.server.context import reset_transport, set_transport
from fastmcp.server.low_level import FastMCPServerMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError

from agent_gateway.downstream.stdin import StdinLines

logger = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1 << 20
"""Bytes of a JWKS read (an identity provider's holds a few keys: a few KB)."""
JWKS_TIMEOUT = 10.0
"""Seconds one fetch of the JWKS may take in all (FastMCP's bound is per read)."""


def lowlevel_server(server: FastMCP[Any]) -> Server[Any]:
    """The ``mcp`` low-level server FastMCP serves through."""
    lowlevel: Server[Any] = server._mcp_server  # pyright: ignore[reportPrivateUsage]
    return lowlevel


class _WhereFastMCPServes:
    """FastMCP's root low-level middleware, entered only for the methods FastMCP serves.

    For every request it binds FastMCP's request context, re-applies its lifespan's shared
    context and opens a tracing seam; for a method whose handler is the gateway's own, none
    of that is read (the pipeline has the request's context, identity and span), so it is
    a cost on every forwarded call and nothing else."""

    def __init__(self, inner: Any, own: frozenset[str]) -> None:
        self._inner = inner
        self._own = own

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method in self._own:
            return await call_next(ctx)
        return await self._inner(ctx, call_next)


def past_fastmcp(lowlevel: Server[Any], own: frozenset[str]) -> None:
    """Requests for ``own`` (methods whose handlers the gateway registered itself) skip
    FastMCP's root middleware; every other request still passes it."""
    for index, middleware in enumerate(lowlevel.middleware):
        if isinstance(middleware, FastMCPServerMiddleware):
            lowlevel.middleware[index] = _WhereFastMCPServes(middleware, own)
            return
    raise RuntimeError("FastMCP's root middleware is not in its low-level server's chain")


async def run_stdio(server: FastMCP[Any], requests: StdinLines) -> None:
    """What FastMCP's ``run_stdio_async`` does, the client's requests read from ``requests``
    instead of the SDK's reader of fd 0, which a stop could not interrupt; a request too long
    to read, or malformed, is answered with an error on the SDK's stream to stdout. The rest
    is theirs: FastMCP's transport marker and lifespan, the SDK's stdio transport (stdout
    claimed as it claims it), the low-level server's loop."""
    token = set_transport("stdio")
    try:
        lowlevel = lowlevel_server(server)
        async with (
            server._lifespan_manager(),  # pyright: ignore[reportPrivateUsage]
            # The SDK reads any object its loop can iterate over; its hint names its own.
            stdio_server(stdin=cast(anyio.AsyncFile[str], requests)) as (read, write),
        ):
            requests.refuse = partial(_refused, write)
            await lowlevel.run(read, write, lowlevel.create_initialization_options())
    finally:
        reset_transport(token)


class _Sends(Protocol):
    """The SDK's stream of messages to stdout (its type is in a private module)."""

    async def send(self, item: SessionMessage, /) -> None: ...


async def _refused(write: _Sends, answer: JSONRPCError) -> None:
    await write.send(SessionMessage(answer))


class BoundedJwks(JWTVerifier):
    """FastMCP's verifier, its JWKS fetched within ``JWKS_TIMEOUT`` in all and at most
    ``MAX_JWKS_BYTES``, and a failed fetch logged. FastMCP's fetch (``_fetch_jwks``) read the
    whole body (100 MB took RSS from 162 to 441 MB) with a 10 s bound on each read only (a
    provider sending its keys a byte at a time held every request that needed them for
    minutes), and said nothing of a failure. A failure raises what FastMCP's caller answers
    with a refusal (``ValueError``); it tries again after its ``jwks_refresh_interval``."""

    async def _fetch_jwks(self) -> dict[str, Any]:
        uri = self.jwks_uri
        if not uri:
            raise ValueError("JWKS URI not configured")
        try:
            with anyio.fail_after(JWKS_TIMEOUT):
                keys = json.loads(await _read_bounded(uri))
        except (TimeoutError, ValueError, httpx2.HTTPError) as exc:
            reason = f"no answer within {JWKS_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else str(exc)
            logger.warning("JWKS from %s not fetched: %s", uri, reason)
            raise ValueError(f"Failed to fetch JWKS: {reason}") from None
        if not isinstance(keys, dict):
            raise ValueError("Invalid JWKS: not a JSON object")
        return cast(dict[str, Any], keys)


async def _read_bounded(uri: str) -> bytes:
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(JWKS_TIMEOUT)) as client,
        client.stream("GET", uri) as response,
    ):
        response.raise_for_status()
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_JWKS_BYTES:
                raise ValueError(f"the JWKS is over {MAX_JWKS_BYTES:,} bytes")
        return bytes(body)
