"""FastMCP's internals the gateway uses (verified against fastmcp 4.2.3): its low-level
``mcp`` server, where the gateway adds its middleware and its own handlers (FastMCP has no
public accessor for it; everything used on it is ``mcp``'s public API), its root
low-level middleware, which the gateway's own methods skip, and its lifespan, which stdio
serving enters itself (``run_stdio``); its JWT verifier's fetch of the JWKS, bounded
(``BoundedJwks``), and its own check of a token's ``nbf``, left to the gateway's
(``leave_nbf_to_caller``)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from functools import partial
from typing import Any, Protocol, cast

import anyio
import httpx2
from fastmcp import FastMCP
from fastmcp.server.auth import JWTVerifier
from fastmcp.server.auth.providers import jwt as fastmcp_jwt
from fastmcp.server.context import reset_transport, set_transport
from fastmcp.server.low_level import FastMCPServerMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError

from agent_gateway.downstream.stdin import StdinLines
from agent_gateway.downstream.stdout import AnsweringStream, SettlingStream, StdoutLines
from agent_gateway.errors import KeysUnavailable

logger = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1 << 20
"""Bytes of a JWKS read (an identity provider's holds a few keys: a few KB)."""
JWKS_TIMEOUT = 10.0
"""Seconds one fetch of the JWKS may take in all (FastMCP's bound is per read)."""
KEYS_RETRY_MAX = 30.0
"""Seconds at most between fetches of the JWKS while no key is held."""
KEPT_KEYS_FOR = 24 * 3600.0
"""Seconds after its fetch a key still checks tokens while the JWKS cannot be fetched again:
an outage of the identity provider should not end every session, nor a key it withdrew
verify tokens for ever."""


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
    instead of the SDK's reader of fd 0, which a stop could not interrupt, and its answers
    written by ``downstream/stdout.py`` instead of the SDK's writer, which a client not
    reading held for ever; a request is read while fewer than ``MAX_IN_FLIGHT`` are
    unanswered; a request too long to read, or malformed, is answered with an error on the
    SDK's stream to stdout. Once the input has ended, the requests in flight are given most of
    ``requests.grace`` to be answered (the SDK is told of the end only then: at its end it
    cancels them) and their answers all of it to be taken; once stdout is closed, nobody takes them, and serving stops at
    once (the calls in flight cancelled, their upstreams told). The rest is theirs: FastMCP's
    transport marker and lifespan, the SDK's stdio transport, the low-level server's loop."""
    token = set_transport("stdio")
    try:
        lowlevel = lowlevel_server(server)
        async with (
            server._lifespan_manager(),  # pyright: ignore[reportPrivateUsage]
            StdoutLines(grace=requests.grace) as answers,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(_stopped_after_grace, requests.ended, tg.cancel_scope, requests.grace)
            tg.start_soon(_stopped_when_unread, answers.closed, tg.cancel_scope)
            # The SDK reads and writes any object with the methods its loops call; its hint
            # names its own.
            stdin, stdout = cast(anyio.AsyncFile[str], requests), cast(anyio.AsyncFile[str], answers)
            async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
                requests.refuse = partial(_refused, write)
                answering = AnsweringStream(write, requests.in_flight)
                settling = SettlingStream(read, requests.in_flight)
                await lowlevel.run(settling, answering, lowlevel.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        reset_transport(token)


async def _stopped_after_grace(ended: anyio.Event, serving: anyio.CancelScope, grace: float) -> None:
    """A client whose input has ended and that takes no more answers is not waited for."""
    await ended.wait()
    await anyio.sleep(grace)
    logger.warning("stdio: input ended %g s ago and the answers left are not taken: stopping", grace)
    serving.cancel()


async def _stopped_when_unread(closed: anyio.Event, serving: anyio.CancelScope) -> None:
    """A client that closed stdout takes no answer: its requests are not served."""
    await closed.wait()
    logger.warning("stdio: the client closed stdout and reads no answers: stopping")
    serving.cancel()


class _Sends(Protocol):
    """The SDK's stream of messages to stdout (its type is in a private module)."""

    async def send(self, item: SessionMessage, /) -> None: ...


async def _refused(write: _Sends, answer: JSONRPCError) -> None:
    await write.send(SessionMessage(answer))


class BoundedJwks(JWTVerifier):
    """FastMCP's verifier, its JWKS fetched within ``JWKS_TIMEOUT`` in all and at most
    ``MAX_JWKS_BYTES``, a failed fetch logged, and an outage of the provider told apart from
    a bad token. FastMCP's fetch (``_fetch_jwks``) read the whole body (100 MB took RSS from
    162 to 441 MB) with a 10 s bound on each read only (a provider sending its keys a byte at
    a time held every request that needed them for minutes), and said nothing of a failure.
    While the JWKS cannot be fetched FastMCP refused every token (401: a client then throws
    its good token away) and dropped its keys an hour after their fetch: here a token signed
    by a key fetched before (within ``KEPT_KEYS_FOR``) is still verified with it, and one
    that no key fetched can check raises ``KeysUnavailable`` (503, retried later)."""

    _outage: str | None = None
    """Why the last fetch of the JWKS failed; None once one succeeds."""

    async def _fetch_jwks(self) -> dict[str, Any]:
        uri = self.jwks_uri
        if not uri:
            raise ValueError("JWKS URI not configured")
        try:
            with anyio.fail_after(JWKS_TIMEOUT):
                keys = json.loads(await _read_bounded(uri))
            if not isinstance(keys, dict):
                raise ValueError("not a JSON object")
        except (TimeoutError, ValueError, httpx2.HTTPError) as exc:
            reason = f"no answer within {JWKS_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else str(exc)
            logger.warning("JWKS from %s not fetched: %s", uri, reason)
            self._outage = _outage_shown(exc) if isinstance(exc, httpx2.HTTPError) else reason
            raise ValueError(f"Failed to fetch JWKS: {reason}") from None
        self._outage = None
        return cast(dict[str, Any], keys)

    async def _get_jwks_key(self, kid: str | None) -> str:
        tried = self._jwks_last_refresh_attempt
        try:
            return await super()._get_jwks_key(kid)
        except ValueError:
            if self._outage is None and tried is not None and self._jwks_last_refresh_attempt == tried:
                raise self._not_fetched_again(tried) from None
            if self._outage is None:
                raise  # the provider answered: the token names no key of its
        if (key := self._kept_key(kid)) is not None:
            return key
        raise KeysUnavailable(
            f"the identity provider's keys cannot be fetched now ({self._outage}); retry later"
        )

    def _not_fetched_again(self, tried: float) -> KeysUnavailable:
        """A key unknown, the JWKS not fetched for it: another token's unknown key had it
        fetched under FastMCP's interval. A key the provider published since (a rotation)
        cannot be told from a made-up one, and a client's flood of made-up ones kept the
        rotated key's tokens refused 401 (thrown away by their clients) for up to 30 s."""
        wait = max(0.0, self._jwks_refresh_interval - (time.monotonic() - tried))
        return KeysUnavailable(
            f"the token's key is not among the identity provider's keys fetched {time.monotonic() - tried:.0f} s"
            f" ago, fetched again within {wait:.0f} s; retry then"
        )

    def _keys_kept(self) -> bool:
        """Whether keys fetched before are held, recent enough to check tokens with."""
        return bool(self._jwks_cache) and time.monotonic() - self._jwks_cache_time <= KEPT_KEYS_FOR

    def _kept_key(self, kid: str | None) -> str | None:
        """The key fetched before that checks ``kid``'s tokens, if it is recent enough."""
        if not self._keys_kept():
            return None
        if kid is not None:
            return self._jwks_cache.get(kid)
        return next(iter(self._jwks_cache.values())) if len(self._jwks_cache) == 1 else None

    @property
    def keys_problem(self) -> str | None:
        """Why no token can be checked now (``/readyz``): the JWKS cannot be fetched and no
        key fetched before is kept. None when tokens can be checked, if only with kept keys
        (every replica shares the provider: all unready for its outage would serve nobody)."""
        if self._outage is None or self._keys_kept():
            return None
        return f"the identity provider's keys (JWKS) cannot be fetched: {self._outage}"

    async def keep_keys(self) -> None:
        """Fetch the JWKS now (at start-up), so the first client is not the one that waits
        for it and ``/readyz`` says at once whether tokens can be checked; while no key is
        held, again every few seconds (``/readyz`` recovers with the provider, not with the
        next client's token). Then FastMCP fetches it again when a token needs it."""
        wait = 1.0
        while True:
            with contextlib.suppress(ValueError):  # logged, and kept as ``keys_problem``
                async with self._shared_jwks_refresh_lock:
                    await self._refresh_jwks_key(None)
            # Not a rate limit for clients: the first token's unknown key is fetched when it comes.
            self._jwks_last_refresh_attempt = None
            if self.keys_problem is None:
                return
            await anyio.sleep(wait)
            wait = min(wait * 2, KEYS_RETRY_MAX)


def leave_nbf_to_caller() -> None:
    """FastMCP's verifier (4.2) refuses a token whose ``nbf`` is over ``_NBF_CLOCK_SKEW_SECONDS``
    (30 s) ahead before any check of the gateway's, which allows ``auth.jwt.leeway`` (up to
    600 s) and logs and counts its refusal: a token within a larger leeway was refused 401, and
    one past it refused unlogged. Its bound made infinite, the gateway's check decides
    (``authentication.ClaimedJWTVerifier``, the only JWT verifier the gateway makes). The bound
    is the module's (no verifier has its own): a process's every verifier leaves it."""
    fastmcp_jwt._NBF_CLOCK_SKEW_SECONDS = math.inf  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]


def _outage_shown(exc: httpx2.HTTPError) -> str:
    """What a client is told of a failed fetch of the JWKS (``KeysUnavailable``'s 503): httpx2's
    text names the URL ("... for url 'https://...'"), which may carry credentials and is the
    operator's (the log has it): the provider's status, or the kind of failure."""
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"the provider answered HTTP {exc.response.status_code}"
    return type(exc).__name__


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
