"""Any replica serves any handshake-era session: a session this replica does not hold is
adopted from its record in the shared store instead of answered "Session not found".

The SDK's session manager knows only the sessions its own process opened. This subclass
(of ``DeferredSessionManager``, so JSON answers are kept) looks a session id it does not
hold up in the shared store (``store/sessions.py``), and when the credential is the one
that opened it, registers a transport under that id and serves it with a connection that
is already initialized (the recorded ``initialize`` params and version), as the SDK's own
loop would be after the handshake; the gateway makes it its own session at once
(``on_adopted``), whichever request adopted it: a notification stream's GET is served by
no handler, and a client that only listens must still have its subscriptions, record and
log level kept by the replica it listens on. A different credential is answered exactly as the SDK
answers one: 404, "Session not found"; while the store does not answer, a session this
replica does not hold is answered 503 and a retry (it may well be live elsewhere). A DELETE
is passed on to the store so every replica forgets the session; a session ended elsewhere is
dropped here (``drop``).

Stream events are scoped by the session id rather than FastMCP's random per-transport
scope, so a stream that dropped on one replica replays on another. A notification that
arises on one replica for a session whose GET stream another replica holds (a resource
update from the upstream subscription this replica made, an upstream's log line) is stored
and published by the first (``store/events.py``) and sent on that stream by the second
(``relay``), under the same event id.

It lives in ``compat/`` because it is built of the SDK manager's private members
(``_server_instances``, ``_session_owners``, ``_session_creation_lock``, ``_task_group``,
``_lifespan_state``, ``_discard_session``, ``_admit_session``), FastMCP's
``_shared_event_store`` and ``SessionScopedEventStore._scope_stream_id``, and the
transport's ``_event_store`` and ``_request_streams``; ``tests/test_compat.py`` checks each.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
from anyio.abc import TaskStatus
from fastmcp.server.session_scoped_event_store import SessionScopedEventStore
from mcp.server.auth.middleware.bearer_auth import (
    AuthorizationContext,
)
from mcp.server.connection import Connection
from mcp.server.runner import aclose_shielded, serve_connection
from mcp.server.streamable_http import (
    GET_STREAM_KEY,
    MCP_SESSION_ID_HEADER,
    StreamableHTTPServerTransport,
)
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from starlette.types import Receive, Scope, Send

from agent_gateway.access import header_of_scope
from agent_gateway.compat.deferred import DeferredSessionManager, deferring
from agent_gateway.compat.lane import json_answer
from agent_gateway.compat.questions import credential_of
from agent_gateway.compat.relays import Relays
from agent_gateway.errors import StoreUnavailable
from agent_gateway.refusals import refused
from agent_gateway.store.events import own_event, stream_digest
from agent_gateway.store.sessions import SessionRecord, SessionRecords

logger = logging.getLogger(__name__)
_SESSION_HEADER = MCP_SESSION_ID_HEADER.lower().encode()
"""The session header as ASGI names it, encoded once rather than per request."""

Ended = Callable[[str], Awaitable[None]]
"""Told that a session (its id) was deleted by its client here."""
Adopted = Callable[[Connection, SessionRecord, Scope], Callable[[], Awaitable[None]]]
"""Called with a session adopted here (its connection, its record, the request that adopted
it) before the session is registered: the gateway serves it as its own from then on. What it
returns is run once the session is registered, in the session's own task beside its loop
(cancelled when the loop ends): nothing is awaited while the replica's session lock is held
(every new session waits for it, and an upstream stuck on a log level would hold each up to
its bound), nor holds up the session's messages or its end."""
_CLAIM_EVERY = 5.0
"""Seconds between two looks, for a notification stream held here, at its session's
subscriptions that no live replica holds."""


class AdoptingSessionManager(DeferredSessionManager):
    """FastMCP's session manager (with deferred answers) that adopts sessions from the store."""

    records: SessionRecords
    on_deleted: Ended
    replica: str
    """This replica's event ids start with it (``SharedEventStore.replica``)."""
    listening: dict[str, Relays]
    """The notification streams this replica holds, by digest: what other replicas wrote for each."""
    deleting: set[str]
    """The sessions whose client's DELETE this replica is serving: the store's announcement
    that they ended, which this replica hears too, must not drop them before the SDK has
    answered the DELETE (it would answer "Session not found")."""
    on_listening: Ended
    """Told, now and then, of each session whose notification stream this replica holds (it
    takes over the session's subscriptions that no replica holds)."""
    on_lost: Ended
    """Told of a session whose record its open notification stream found gone from the store."""
    on_adopted: Adopted
    has_room: Callable[[], bool]
    """Whether this replica holds fewer than its ``server.max_sessions``: a session is adopted
    only then (a session ended here to make room would otherwise come back at its next request,
    past the bound; refused, its client gets 404 and opens a new one, through admission)."""

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = header_of_scope(scope, _SESSION_HEADER)
        if session_id is not None and session_id not in self._server_instances:
            try:
                await self._adopt(session_id, scope)
            except StoreUnavailable as exc:
                await _not_looked_up(session_id, str(exc), send)
                return
        # Another credential's request is the SDK's to refuse (404), before anything here
        # touches the session: a GET would take its stream's relays from its own client.
        owned = session_id in self._server_instances and (
            self._session_owners.get(session_id) == credential_of(scope)
        )
        if owned and scope["method"] == "GET":
            assert session_id is not None
            await self._listening(session_id, scope, receive, send)
            return
        if owned and scope["method"] == "DELETE":
            assert session_id is not None
            # Ended in the store first: what closes with the session here (its dedicated
            # upstream sessions) then finds it ended everywhere, not held by another replica.
            self.deleting.add(session_id)
            try:
                await self.on_deleted(session_id)
                await super()._handle_stateful_request(scope, receive, send)
            finally:
                self.deleting.discard(session_id)
            return
        await super()._handle_stateful_request(scope, receive, send)

    async def _listening(self, session_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A session's notification stream, its record kept alive while the stream is open:
        a client that only listens sends no request that would push its expiry back."""

        async def keep_alive() -> None:
            while True:
                await anyio.sleep(self.records.idle_seconds / 3)
                if await self.records.touch(session_id) is False:
                    await self.on_lost(session_id)

        async def hold_subscriptions() -> None:
            while True:  # now, and every few seconds while the stream is open here
                await self.on_listening(session_id)
                await anyio.sleep(_CLAIM_EVERY)

        digest = stream_digest(self._listening_stream(session_id))
        if digest in self.listening:  # open here: the SDK answers 409, the open one keeps its relays
            await super()._handle_stateful_request(scope, receive, send)
            return
        relays = self.listening[digest] = Relays(session_id)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_alive)
                tg.start_soon(hold_subscriptions)
                tg.start_soon(relays.forward, self._server_instances[session_id])
                await super()._handle_stateful_request(scope, receive, send)
                tg.cancel_scope.cancel()
        finally:
            self.listening.pop(digest, None)
            relays.close()

    async def relay(self, message: str) -> None:
        """An event of a session's notification stream that another replica wrote
        (``<event id>\n<message>``): queued for that stream when this replica holds it (the
        bus waits on no client, ``compat/relays.py``)."""
        event_id, _, data = message.partition("\n")
        _, _, digest = event_id.partition("/")
        relays = self.listening.get(digest)
        if relays is not None and not own_event(event_id, self.replica):
            relays.put(event_id, data)

    async def drop(self, session_id: str) -> None:
        """Forget ``session_id`` here: it was deleted through another replica."""
        transport = self._server_instances.get(session_id)
        if transport is not None and session_id not in self.deleting:  # else the DELETE ends it
            logger.info("session %s ended on another replica: dropped here", session_id)
            await self._discard_session(session_id, transport)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            self._scope_events(transport)
        return transport

    async def _adopt(self, session_id: str, scope: Scope) -> None:
        requestor = credential_of(scope)
        record = await self.records.find(session_id)
        if record is None:
            return
        if (dict(record.credential) if record.credential is not None else None) != requestor:
            logger.warning(
                "session %s: not adopted, the credential is not the one that opened it", session_id[:64]
            )
            return
        async with self._session_creation_lock:
            if session_id in self._server_instances:
                return  # adopted meanwhile, by a concurrent request
            if not self.has_room():
                logger.info("session %s: not adopted, this replica holds its max_sessions", session_id[:64])
                return
            transport = StreamableHTTPServerTransport(
                mcp_session_id=session_id,
                is_json_response_enabled=self.json_response,
                event_store=None,
                security_settings=self.security_settings,
                retry_interval=self.retry_interval,
                idle_timeout=self.session_idle_timeout,
            )
            deferring(transport, self)
            self._scope_events(transport)
            # Connected before it is registered: a concurrent request for the same session
            # must find it ready to take messages.
            assert self._task_group is not None, "run() is entered before any request"
            await self._task_group.start(self._serve_adopted, transport, record, scope)
            if requestor is not None:
                self._session_owners[session_id] = requestor
            self._server_instances[session_id] = transport
        logger.info("session %s adopted from the shared store", session_id)

    async def _serve_adopted(
        self,
        transport: StreamableHTTPServerTransport,
        record: SessionRecord,
        scope: Scope,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The SDK's session loop (``serve_loop``), on a connection initialized from ``record``
        and made the gateway's session (``on_adopted``) before the adopting request is served."""
        async with transport.connect() as (read_stream, write_stream):
            try:
                idle_scope = transport.idle_scope or anyio.CancelScope()
                with idle_scope:
                    dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                        read_stream, write_stream, inline_methods=frozenset({"initialize"})
                    )
                    connection = Connection(
                        dispatcher,
                        protocol_version=record.version,
                        session_id=record.id,
                        client_params=record.params,
                    )
                    connection.initialized.set()
                    try:
                        then = self.on_adopted(connection, record, scope)
                        task_status.started()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(_run, then)
                            await serve_connection(
                                self.app,
                                dispatcher,
                                connection=connection,
                                lifespan_state=self._lifespan_state,
                            )
                            tg.cancel_scope.cancel()
                    finally:  # what it opened ends with it, should the loop never have run
                        await aclose_shielded(connection)
            except Exception:
                logger.exception("adopted session %s crashed", record.id)
            finally:
                await self._discard_session(record.id, transport)

    def _listening_stream(self, session_id: str) -> str:
        """A session's notification stream id as its events are stored (scoped by the session)."""
        scoped = SessionScopedEventStore(self._shared_event_store, session_id=session_id)  # type: ignore[arg-type]
        return scoped._scope_stream_id(GET_STREAM_KEY)  # pyright: ignore[reportPrivateUsage]

    def _scope_events(self, transport: StreamableHTTPServerTransport) -> None:
        """Scope the transport's stream events by its session id (the same on every replica)."""
        shared = self._shared_event_store
        if shared is not None and transport.mcp_session_id is not None:
            transport._event_store = SessionScopedEventStore(shared, session_id=transport.mcp_session_id)  # pyright: ignore[reportPrivateUsage]


async def _run(then: Callable[[], Awaitable[None]]) -> None:
    await then()


async def _not_looked_up(session_id: str, why: str, send: Send) -> None:
    """A session this replica does not hold, while the store cannot say whether it lives:
    503 and a retry, not "Session not found", which tells a client its session is gone (it
    starts again, its state lost to a moment's outage). The connection closes, so that the
    retry may reach another replica, the one holding the session among them."""
    refused("store_unavailable", "session %s not looked up: %s", session_id, why, level=logging.INFO)
    error = {
        "code": StoreUnavailable.code,
        "message": "the shared session store does not answer: retry shortly",
    }
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await json_answer(send, body, 503, [(b"retry-after", b"1"), (b"connection", b"close")])


def adopt_sessions(
    manager: Any,
    records: SessionRecords,
    on_deleted: Ended,
    replica: str,
    on_listening: Ended,
    on_lost: Ended,
    on_adopted: Adopted,
    has_room: Callable[[], bool],
) -> AdoptingSessionManager | None:
    """Make ``manager`` (already a ``DeferredSessionManager``) adopt sessions from the store;
    None (logged) for a manager of another kind."""
    if type(manager) is not DeferredSessionManager:
        logger.error(
            "session manager %s not recognised: sessions will not move between replicas", type(manager)
        )
        return None
    manager.__class__ = AdoptingSessionManager
    adopting = cast(AdoptingSessionManager, manager)
    adopting.records = records
    adopting.on_deleted = on_deleted
    adopting.replica = replica
    adopting.listening = {}
    adopting.deleting = set()
    adopting.on_listening = on_listening
    adopting.on_lost = on_lost
    adopting.on_adopted = on_adopted
    adopting.has_room = has_room
    return adopting
