"""Downstream sessions: who is connected, their gateway session ids, and when they end.

A handshake-era client has one session for its connection (``Mcp-Session-Id``, or the stdio
pipe), a modern one (2026-07-28) one per request, ended with it. What a session held upstream
(dedicated sessions) is released when it ends (HTTP DELETE, idle expiry, stdio EOF, shutdown).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, get_args

import anyio
import mcp_types as types
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.server.connection import Connection
from mcp.shared.dispatcher import ProgressFnT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_gateway import access
from agent_gateway.access import Principal
from agent_gateway.authentication import secret_of
from agent_gateway.compat.mcp import connection_of
from agent_gateway.compat.questions import credential_of
from agent_gateway.downstream.input_requests import asked, elicits_by_url, refusal, result_type
from agent_gateway.meta_keys import NO_META
from agent_gateway.opening import session_opened
from agent_gateway.runtime import CLEANUP_TIMEOUT, SEND_TIMEOUT
from agent_gateway.store.sessions import SessionRecord, SessionRecords
from agent_gateway.tally import sessions_active
from agent_gateway.upstreams.client_side import EVERYTHING

logger = logging.getLogger(__name__)

LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
"""The log levels, least severe first (as MCP lists them)."""
STATE_KEY = "agent_gateway.session"

CURRENT: contextvars.ContextVar[DownstreamSession | None] = contextvars.ContextVar(
    "agent_gateway_session", default=None
)
"""The downstream session of the request being handled."""


def wanted(level: types.LoggingLevel, threshold: types.LoggingLevel | None) -> bool:
    """Whether a line at ``level`` passes a client's ``threshold`` (None: no filter set)."""
    return threshold is None or LEVELS.index(level) >= LEVELS.index(threshold)


def relabelled(
    upstream: str, params: types.LoggingMessageNotificationParams
) -> types.LoggingMessageNotificationParams:
    """A relayed line's params: its logger name is the upstream's name, then its own logger."""
    name = f"{upstream}.{params.logger}" if params.logger else upstream
    return params.model_copy(update={"logger": name})


@dataclass(eq=False)
class DownstreamSession:
    """One client session as the gateway knows it."""

    id: str
    era: str
    """``handshake`` or ``modern``."""
    transport: str
    connection: Connection | None
    """The handshake-era channel outside any request (None in the modern era)."""
    capabilities: types.ClientCapabilities | None = None
    log_level: types.LoggingLevel | None = None
    started: float = field(default_factory=time.monotonic)
    upstream_sessions: set[str] = field(default_factory=set)
    """Ids of the upstream sessions this session has used (for the mapping in logs)."""
    client: Principal | None = None
    """Who opened the session (None: no auth, or no request seen yet)."""
    secret: str | None = None
    """Which static token secret opened it (``authentication.secret_of``): a reload rotating it ends it."""
    software: str | None = None
    """What the client says it is (``clientInfo.name``), when it says."""
    record: SessionRecord | None = None
    """What the shared store holds of it (handshake era, HTTP, with a store): written when its
    ``initialize`` is answered, or read when it was adopted."""
    waiting: int = 0  # requests to its client outside any call, unanswered (input_requests.asked)

    @cached_property
    def conversation(self) -> str:
        """The agent's default thread for this session: random, since upstreams see ``id``
        (drawn when first asked for: most sessions never run the agent)."""
        return f"session-{uuid.uuid4().hex}"

    @property
    def subject(self) -> str:
        """Who opened it: the token name or JWT subject."""
        return self.client.subject if self.client is not None else access.ANONYMOUS

    @property
    def label(self) -> str:
        """Its client as limits count it and log lines name it (an anonymous one by address)."""
        return self.client.label if self.client is not None else access.ANONYMOUS

    # -- the Downstream protocol, at session level (no request in flight) ---------------------

    @property
    def session_id(self) -> str:
        return self.id

    @property
    def modern(self) -> bool:
        return self.era == "modern"

    @property
    def lasting(self) -> DownstreamSession:
        return self

    @property
    def input_responses(self) -> types.InputResponses | None:
        return None

    @property
    def request_state(self) -> str | None:
        return None

    @property
    def client_meta(self) -> Mapping[str, Any]:
        return NO_META  # no request of its own: a session's calls are its callers'

    def progress_relay(self) -> ProgressFnT | None:
        return None

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        if self.connection is None or not wanted(params.level, self.log_level):
            return
        line = relabelled(upstream, params).model_dump(by_alias=True, mode="json", exclude_none=True)
        with anyio.move_on_after(SEND_TIMEOUT):
            # Connection.notify, not the deprecated Connection.log: same frame, no warning.
            await self.connection.notify("notifications/message", line)

    async def elicitation_complete(
        self, upstream: str, params: types.ElicitCompleteNotificationParams, *, during_call: bool = False
    ) -> None:
        if self.connection is None or self.modern or not elicits_by_url(self.capabilities):
            return
        with anyio.move_on_after(SEND_TIMEOUT):
            await self.connection.notify(
                "notifications/elicitation/complete",
                params.model_dump(by_alias=True, mode="json", exclude_none=True),
            )

    async def ask(self, upstream: str, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        if (refused := refusal(self.modern, self.capabilities, request)) is not None:
            return refused
        assert self.connection is not None  # refusal() covers the modern era
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        raw = await asked(self, partial(self.connection.send_raw_request, data["method"], data.get("params")))
        if isinstance(raw, types.ErrorData):
            return raw
        return result_type(request).model_validate(raw, by_name=False)

    def used(self, upstream_session_id: str) -> None:
        if upstream_session_id not in self.upstream_sessions:
            self.upstream_sessions.add(upstream_session_id)
            # A modern-era "session" is one request: a line for each would be one per call.
            level = logging.INFO if self.era == "handshake" else logging.DEBUG
            logger.log(level, "session %s -> upstream session %s", self.id, upstream_session_id)


def standing(client: Principal) -> DownstreamSession:
    """The owner of an authenticated modern-era client's dedicated upstream sessions across its
    requests (``upstreams/dedicated.py``): of that era, with no channel, open in no registry;
    its id the same for each of the client's requests, and naming no secret. The upstream is
    told it may ask everything, as a shared session's is: each request's own capabilities
    decide what that request is asked (a held call's, ``held_calls.HeldCaller.ask``)."""
    # surrogatepass: a name no UTF-8 holds (refused in a token, ``authentication.py``) still
    # names a session of its own rather than failing each request of its client.
    digest = hashlib.sha256(client.label.encode(errors="surrogatepass")).hexdigest()[:16]
    return DownstreamSession(
        f"client-{digest}", "modern", "http", None, capabilities=EVERYTHING, client=client
    )


def _software(connection: Connection) -> str | None:
    """What the client says it is (``clientInfo.name``, cut), once it has said."""
    params = connection.client_params
    return params.client_info.name[:64] if params is not None else None


SessionHook = Callable[[DownstreamSession], Awaitable[None]]
LevelsHook = Callable[[DownstreamSession | None], Awaitable[None]]
"""Told the session that set a log level, or None when a handshake-era client came or went."""


class SessionRegistry(Middleware):
    """Gives every request its downstream session, and ends sessions when their clients go.

    With a shared store, each handshake-era HTTP session is recorded there once its
    ``initialize`` is answered (and its log level when set), so other replicas can adopt it.
    """

    def __init__(
        self,
        on_end: SessionHook,
        on_levels: LevelsHook,
        records: SessionRecords | None = None,
        holds: Callable[[DownstreamSession], bool] = lambda _: True,
    ) -> None:
        """``on_end`` releases what a session holds upstream, when ``holds`` says it holds
        anything (both are the server's: subscriptions and dedicated upstream sessions)."""
        self.live: dict[str, DownstreamSession] = {}
        self.opened = 0
        self.ended = 0
        self.adopted = 0
        """Sessions opened on another replica and served here too (shared store)."""
        self.manager: object | None = None
        """The SDK's HTTP session manager, which can end a session (set once the app runs)."""
        self._on_end = on_end
        self._holds = holds
        self._on_levels = on_levels
        self._records = records

    async def on_initialize(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        result = await call_next(context)
        ctx = context.fastmcp_context
        request = ctx.request_context if ctx is not None else None
        if self._records is not None and request is not None:
            await self._record(request, context.message, result)
        return result

    async def _record(self, request: Any, message: Any, result: Any) -> None:
        """Put the session the handshake just settled in the shared store (HTTP only).

        From the ``initialize`` request and its answer: the SDK records them on the connection
        only once this hook has returned."""
        assert self._records is not None
        connection = connection_of(request.session)
        scope = getattr(request.request, "scope", None)
        if (
            connection.session_id is None
            or not isinstance(message, types.InitializeRequest)
            or not isinstance(result, types.InitializeResult)
            or not isinstance(scope, dict)
        ):
            return
        client = access.current()
        record = SessionRecord(
            id=connection.session_id,
            client=client.label if client is not None else access.ANONYMOUS,
            credential=credential_of(scope),
            params=message.params,
            version=result.protocol_version,
        )
        if isinstance(session := connection.state.get(STATE_KEY), DownstreamSession):
            session.record = record  # to be written again should the store lose it
        await self._records.opened(record)

    def connection(self, session_id: str) -> Connection | None:
        """The handshake-era connection of the live session ``session_id``, if any."""
        session = self.live.get(session_id)
        return session.connection if session is not None else None

    def handshake_sessions(self) -> Iterator[DownstreamSession]:
        return (s for s in list(self.live.values()) if s.connection is not None)

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        ctx = context.fastmcp_context
        request = ctx.request_context if ctx is not None else None
        if request is None:
            return await call_next(context)
        async with self.serving(request) as session:
            if context.method == "logging/setLevel" and isinstance(context.message, Mapping):
                await self._set_level(session, context.message.get("level"))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
            return await call_next(context)

    @asynccontextmanager
    async def serving(self, request: Any) -> AsyncIterator[DownstreamSession]:
        """The session of ``request`` (an SDK or FastMCP request context), current while it is
        served; a modern request's session ends with it."""
        session, opened = self._attach(request)
        if opened and not session.modern:  # one more client whose level counts upstream
            await self._on_levels(None)
        bound = CURRENT.set(session)
        try:
            yield session
        finally:
            CURRENT.reset(bound)
            if session.modern:
                await self.end(session)

    def _attach(self, request: Any) -> tuple[DownstreamSession, bool]:
        """The session of ``request``, and whether it was opened for it."""
        connection = connection_of(request.session)
        if request.protocol_version in MODERN_PROTOCOL_VERSIONS:
            caps = request.session.client_capabilities
            session = self._open(secrets.token_hex(16), "modern", None, caps, access.current())
            session.secret = secret_of(access.token_of(request.request))
            return session, True
        known = connection.state.get(STATE_KEY)
        if isinstance(known, DownstreamSession):
            if known.capabilities is None:  # stored only once initialize has completed
                known.capabilities = request.session.client_capabilities
            if known.software is None:  # likewise
                known.software = _software(connection)
            return known, False
        sid, caps = connection.session_id or uuid.uuid4().hex, request.session.client_capabilities
        session = self._hold(self._open(sid, "handshake", connection, caps, access.current()))
        session.secret = secret_of(access.token_of(request.request))
        return session, True

    def adopt(
        self, connection: Connection, record: SessionRecord, client: Principal | None, secret: str | None
    ) -> Callable[[], Awaitable[None]]:
        """Serve here the session ``record`` describes, adopted from the shared store on
        ``connection`` by ``client``'s request: live from now on, before that request is
        served, since a GET opening its notification stream is served by no handler (a client
        that only listens sends this replica nothing else, and the session's subscriptions,
        its record and its log level must still be kept here). Returns what is left: its
        level applied upstream, to run once the session is registered."""
        caps = connection.client_capabilities
        session = self._hold(self._open(record.id, "handshake", connection, caps, client))
        session.log_level, session.record, session.secret = record.level, record, secret
        self.adopted += 1
        return partial(self._on_levels, None)

    def _hold(self, session: DownstreamSession) -> DownstreamSession:
        """``session`` kept on its connection, and ended with it."""
        assert session.connection is not None
        session.connection.state[STATE_KEY] = session
        session.software = _software(session.connection)
        # Unwound on DELETE, idle expiry, stdio EOF and shutdown alike.
        session.connection.exit_stack.push_async_callback(self.end, session)
        return session

    def _open(
        self,
        sid: str,
        era: str,
        connection: Connection | None,
        caps: types.ClientCapabilities | None,
        client: Principal | None,
    ) -> DownstreamSession:
        transport = "stdio" if connection is not None and connection.session_id is None else "http"
        session = DownstreamSession(sid, era, transport, connection, capabilities=caps, client=client)
        self.live[sid] = session
        if session.client is not None and era == "handshake":  # modern: counted by admission
            session.client.sessions += 1
            session_opened(session.client)
        self.opened += 1
        sessions_active.add(1, {"mcp.era": era})
        if era == "handshake":
            logger.info("session %s started (%s, %s era)", sid, transport, era)
        return session

    async def end(self, session: DownstreamSession) -> None:
        """Forget ``session`` and release what it held upstream (bounded, shielded)."""
        if self.live.pop(session.id, None) is None:
            return
        if session.client is not None and session.era == "handshake":
            session.client.sessions -= 1
        self.ended += 1
        sessions_active.add(-1, {"mcp.era": session.era})
        # Most hold nothing (every modern-era request ends a session): then no shielded,
        # bounded scope is entered, 2.6 % of such a call's instructions.
        if self._holds(session):
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
                await self._on_end(session)
        if session.era == "handshake":
            logger.info(
                "session %s ended after %.1fs (upstream sessions used: %s)",
                session.id,
                time.monotonic() - session.started,
                ", ".join(sorted(session.upstream_sessions)) or "none",
            )
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
                await self._on_levels(None)  # its level no longer counts upstream

    async def level_set_elsewhere(self, session_id: str, level: str) -> None:
        """A session's log level was set through another replica: this one filters the
        session's log lines by it too, when it serves the session."""
        session = self.live.get(session_id)
        if session is not None and level in LEVELS and level != session.log_level:
            session.log_level = LEVELS[LEVELS.index(level)]
            await self._on_levels(session)

    async def _set_level(self, session: DownstreamSession, level: Any) -> None:
        if level in LEVELS:
            session.log_level = level
            if self._records is not None and session.transport == "http" and session.era == "handshake":
                await self._records.level_set(session.id, level)
            await self._on_levels(session)
