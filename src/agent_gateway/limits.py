"""Admission in front of the MCP endpoint: what must be decided before the SDK reads a body.

Every POST to the endpoint (a request, a notification, an answer) passes here first:

- The client is found (from its verified token; unauthenticated requests, any method, pass on
  unread to their 401, ``request_body.unread``, in a turn of their address's) and its rate
  limit taken, before a byte of the body is parsed: a client over its limit costs the gateway
  a lookup, never a parse.
- A request that opens a session (a handshake-era ``initialize``, or a modern-era request,
  which is a session while it runs), once its body has passed the checks below: refused
  once the client has ``max_sessions`` open and none idle, so one client cannot fill the table
  everyone shares; an ``initialize`` also within this replica's ``server.max_sessions``, room
  made fairly (``downstream/room.py``). Never an idle session ended for a request that would
  not open one (a ping without a session id, a malformed body).
- With a shared store (several replicas) the rate limit and the handshake-era session count
  are the store's, counted once across replicas (``store/limits.py``); while the store is
  unreachable, this replica's own counts apply (never no limit).
- The body must arrive within ``server.connections.body_timeout``.
- A body with more than ``server.max_body_elements`` JSON values is refused unparsed:
  parsing is done on the event loop, where a million ``{}`` stall every client.
- The body limit: a body over ``server.max_body_bytes`` is refused with 413 and a JSON-RPC
  error before any of it is parsed. A declared ``Content-Length`` is refused up front; a
  chunked body is counted as it arrives and refused as soon as it passes the limit.
- The body's shape (``body_shape.py``: its id, its method, what is kept of its client); a
  request it refuses gets ``Invalid Request`` by its id (null for an id it refuses).
- Any other request (a GET, a DELETE) carries no body: one with a body is refused unread, a
  chunked one at its first chunk (the SDK read any body whole, uncounted, with no deadline);
  one without takes its client's working turn (``turns.py``), but a GET of the MCP endpoint.

The body is read here in full (the SDK reads it in full too) and handed on unchanged.
Refusals are JSON-RPC errors with the request's id as its first kilobyte tells it, unparsed
(``request_body.requested_id``), else null (JSON-RPC 2.0: only an id that cannot be told).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp_types import RequestId
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_gateway import body_shape, request_body
from agent_gateway.access import (
    IDENTIFIED,
    AccessControl,
    Principal,
    address_of_scope,
    admitting,
    header_of_scope,
    token_of_scope,
)
from agent_gateway.compat import questions
from agent_gateway.downstream.room import Room
from agent_gateway.errors import GatewayBusy, GatewayError, InvalidRequest
from agent_gateway.in_flight import BodyHeld
from agent_gateway.opening import Opened, Opening
from agent_gateway.over_limits import (
    Refusal,
    bound_refusal,
    rate_refusal,
    refuse,
    sessions_refusal,
    unanswered,
    verdict_refusal,
)
from agent_gateway.refusals import refused
from agent_gateway.store.limits import SharedLimits, Verdict
from agent_gateway.turns import Strangers, Turns, bodiless_turn, parsing_turn, serving_turn

INVALID_REQUEST = -32600
_SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = b"mcp-protocol-version"


@dataclass(frozen=True)
class Bounds:
    """What one POST may be: its size, its time to arrive and its number of JSON values."""

    body_bytes: int
    body_timeout: float
    body_elements: int
    authenticated: bool
    """Auth is on: a request without a verified token is passed on, to be answered 401."""
    path: str
    """The MCP endpoint's path: a GET there is a notification stream."""


Refused = Callable[[str, str | None, bytes, str], None]
"""Told of a request refused here: (client, session id, body, why), for the call records."""


class Admission:
    """ASGI middleware: admission of every POST (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        access: AccessControl,
        bounds: Bounds,
        on_refused: Refused | None = None,
        shared: SharedLimits | None = None,
        room: Room | None = None,
    ) -> None:
        self.app = app
        self.access = access
        self.bounds = bounds
        self.on_refused = on_refused
        self.room = room
        """Room for a client's next session at its cap, and for any at this replica's bound
        (``server.max_sessions``)."""
        self.shared = shared
        """Limits counted across replicas (``store:``); None, or the store unreachable: this
        replica's own counts."""
        self.strangers = Strangers()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.bounds.authenticated and not isinstance(scope.get("user"), AuthenticatedUser):
            answering = await request_body.unread(scope, receive, send)  # before its turn: no work
            async with self.strangers.turn(address_of_scope(scope)):
                await self.app(scope, receive, answering)  # 401 (/healthz, OAuth metadata: served)
            return
        if scope["method"] != "POST":
            await self._bodiless(scope, receive, send)
            return
        client = self.access.principal(token_of_scope(scope), address_of_scope(scope))
        scope[IDENTIFIED] = client
        held = BodyHeld(client)
        try:
            # Read, not parsed: the limits below cost a client over them a read, never a parse.
            if (body := await self._body(scope, receive, send, held)) is not None:
                await self._admit(scope, receive, send, client, body)
        finally:
            held.release()

    async def _bodiless(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request other than a POST, passed on unless a body follows: none has one (MCP's
        GET and DELETE have none), and the SDK read any request's whole before its method, with
        no deadline and uncounted in flight. Refused unread (``request_body.bodiless``), closed."""
        deadline = anyio.current_time() + self.bounds.body_timeout  # a chunked one's end, as a POST's
        method = scope["method"]
        if (passed := await request_body.bodiless(scope, receive, deadline)) is not None:
            path = self.bounds.path  # a GET there is a stream (under a root_path, its path holds it)
            if method == "GET" and scope["path"] in (path, scope.get("root_path", "") + path):
                await self.app(scope, passed, send)
                return
            client = self.access.principal(token_of_scope(scope), address_of_scope(scope))
            turns = client.turns = client.turns or Turns()
            async with bodiless_turn(turns, client.label):
                await self.app(scope, passed, send)
            return
        address = address_of_scope(scope)
        refused("body", "refused a %s request carrying a body, from %s", method, address)
        await refuse(
            send, 400, InvalidRequest(f"a {method} request carries no body"), [(b"connection", b"close")]
        )

    async def _admit(
        self, scope: Scope, receive: Receive, send: Send, client: Principal, body: bytes
    ) -> None:
        # A modern-era request is a session only while it runs: counted by this replica alone
        # (a round trip each would double its cost); a handshake-era session across replicas.
        # The era as the session manager routes it (``compat/deferred.py``): no version, or a
        # handshake one, is the handshake era; any other, the modern lane (which refuses it).
        version = header_of_scope(scope, _VERSION_HEADER)
        modern = version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        # That era has no session id: a modern request opens a session whatever Mcp-Session-Id
        # it carries (the SDK ignores it), else any header let its listen streams past the cap.
        session = None if modern else header_of_scope(scope, _SESSION_HEADER)
        verdict = await self._shared_verdict(client, session, opening=session is None and not modern)
        if verdict is not None and verdict.refused == "sessions" and self._initialize(body, scope):
            verdict = await self._room_across_replicas(client, verdict)
        refusal = verdict_refusal(client, verdict) if verdict is not None else None
        if refusal is None and verdict is None:
            refusal = self._over_rate(client)
        if refusal is not None:
            limited, headers = refusal
            if self.on_refused is not None:
                self.on_refused(client.subject, session, body, str(limited))
            await refuse(send, 429, limited, headers, request_body.requested_id(body))
            return
        turns = client.turns = client.turns or Turns()
        async with parsing_turn(turns, client.label, len(body)):
            problem = self._shape_problem(body, scope)
        if problem is not None:
            await self._refuse_body(send, client, 400, *problem, request_id=body_shape.answerable_id(body))
            if verdict is not None and verdict.reservation is not None:
                await self._settle(client, verdict.reservation, None)
            return
        # A large request takes its turn before the session checks (one let past them while it
        # waited would open a session past them).
        request = parsed[1] if (parsed := scope.get(PARSED)) is not None else None
        async with serving_turn(turns, client.label, body, request, session) as served:
            if served:
                await self._serve(scope, receive, send, client, body, session, modern, verdict)
            else:  # cancelled by its client while it waited: ended, never served
                await unanswered(send, session)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        client: Principal,
        body: bytes,
        session: str | None,
        modern: bool,
        verdict: Verdict | None,
    ) -> None:
        # After the body's checks, and only for a request that opens a session (a modern one,
        # or an ``initialize``): else one that never would ended others' to make room for it.
        opens = session is None and (modern or _initializes(scope))
        own = opens and (verdict is None or modern)  # with a store, it counts handshake sessions
        if opens and (no_room := self._no_room(client, own=own, handshake=not modern)) is not None:
            status, error, headers = no_room
            if self.on_refused is not None:
                self.on_refused(client.subject, session, body, str(error))
            await refuse(send, status, error, headers, request_body.requested_id(body))
            if verdict is not None and verdict.reservation is not None:
                await self._settle(client, verdict.reservation, None)
            return
        with admitting(client):
            try:
                if session is not None:
                    await self.app(scope, request_body.replay(body, receive), send)
                else:
                    await self._opening(
                        scope, request_body.replay(body, receive), send, client, verdict, opens and not modern
                    )
            finally:
                if (why := scope.get(CHECKS_REFUSED)) is not None:
                    self._checks_refused(client, session, body, why)

    async def _opening(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        client: Principal,
        verdict: Verdict | None,
        initialize: bool,
    ) -> None:
        """A request without a session served, counted as opening one (``opening.py``); an
        ``initialize`` for this replica's bound too."""
        reservation = verdict.reservation if verdict is not None else None
        opened = Opened(send, None if reservation is None else partial(self._settle, client, reservation))
        openings = self.room.openings if self.room is not None and initialize else None
        try:
            with Opening(client, openings):
                await self.app(scope, receive, opened.send)
        finally:
            await opened.settled()

    def _initialize(self, body: bytes, scope: Scope) -> bool:
        """Whether ``body`` is an ``initialize`` that passes the body's checks (parsed once)."""
        return self._shape_problem(body, scope) is None and _initializes(scope)

    async def _room_across_replicas(self, client: Principal, verdict: Verdict) -> Verdict:
        """The store's verdict on ``client``'s ``initialize`` once a session of its that no
        replica serves has ended for it (``store/room.py``); ``verdict`` when none could."""
        if self.room is None or self.shared is None or not await self.room.make_shared(client):
            return verdict
        return await self.shared.admit(client, None, opening=True) or verdict

    def _no_room(
        self, client: Principal, *, own: bool, handshake: bool
    ) -> tuple[int, GatewayError, list[tuple[bytes, bytes]]] | None:
        """Why no session may open for ``client``'s request (its HTTP status, the error and its
        headers): its own ``max_sessions`` (``own``: counted here), or this replica's bound
        (``handshake``: a session kept after the request); None once room is made."""
        open_now = client.sessions + client.opening
        if (
            own
            and open_now >= client.policy.max_sessions
            and (self.room is None or not self.room.make(client))
        ):
            return 429, *sessions_refusal(client, open_now)
        if handshake and self.room is not None and not self.room.admit(client):
            return 503, *bound_refusal(self.room.max_sessions)
        return None

    def _checks_refused(self, client: Principal, session: str | None, body: bytes, why: str) -> None:
        refused("checks", "refused a modern-era request of %s: %s", client.label, why, peer=client.label)
        if self.on_refused is not None:
            self.on_refused(client.subject, session, body, why)

    async def _shared_verdict(
        self, client: Principal, session: str | None, *, opening: bool
    ) -> Verdict | None:
        """The shared limits' verdict, when this request needs the store (None: it does not, or
        the store is unavailable, and this replica's own counts apply)."""
        shared = self.shared
        if shared is None or not shared.needed(client, session, opening=opening):
            return None
        return await shared.admit(client, session, opening=opening)

    async def _settle(self, client: Principal, reservation: str, session: str | None) -> None:
        assert self.shared is not None
        with anyio.CancelScope(shield=True):  # bounded by the store's own timeout
            await self.shared.settle(client, reservation, session)

    def _over_rate(self, client: Principal) -> Refusal | None:
        """Why ``client`` is refused this request by its rate limit (this replica's count)."""
        if client.bucket is not None and (wait := client.bucket.take()) is not None:
            return rate_refusal(client, wait)
        return None

    async def _body(self, scope: Scope, receive: Receive, send: Send, held: BodyHeld) -> bytes | None:
        """The body, whole and in time; None when it was refused (answered) or the client left."""
        limit = self.bounds.body_bytes
        declared = request_body.content_length(scope)
        body: bytes | GatewayBusy | request_body.Oversized | None = None  # None: not in time
        deadline = anyio.current_time() + self.bounds.body_timeout
        if declared is not None and declared > limit:  # refused unread, but an answer's id
            body = request_body.Oversized(b"", declared)  # 413 even if its head never comes
            manager = self._manager  # only its own session's client is asked questions
            if manager is not None and questions.session_of(manager, scope) is not None:
                body = request_body.Oversized(await request_body.head(receive, deadline), declared)
        else:
            # A bare scope with a deadline: what move_on_after wraps, without its generator (per call).
            with anyio.CancelScope(deadline=deadline):
                body = await request_body.read(receive, held, limit)
        if isinstance(body, GatewayBusy):
            await refuse(send, 503, body, [(b"retry-after", b"1"), (b"connection", b"close")])
        elif isinstance(body, request_body.Oversized):
            await self._oversized(scope, send, held.client, body)
        elif body is request_body.GONE:
            pass  # the client left before its body was whole: nothing to answer
        elif isinstance(body, bytes):
            return body
        else:
            waited = f"the request body did not arrive within {self.bounds.body_timeout:g}s"
            await self._refuse_body(send, held.client, 408, waited)
        return None

    async def _oversized(
        self, scope: Scope, send: Send, client: Principal, body: request_body.Oversized
    ) -> None:
        """Refuse a body past the limit; if it is an answer to a question the gateway asked the
        client, that question fails at once, saying so (``request_body.py``)."""
        size = f"{body.size} bytes" if body.size is not None else f"over {self.bounds.body_bytes} bytes"
        why = f"request body is {size}; the limit (server.max_body_bytes) is {self.bounds.body_bytes}"
        manager = self._manager
        if manager is not None and (answered := request_body.answered_id(body.head)) is not None:
            await questions.fail(manager, scope, answered, f"the client's answer was not read: its {why}")
        await self._refuse_body(send, client, 413, why, request_id=request_body.requested_id(body.head))

    @property
    def _manager(self) -> object | None:
        """The SDK's session manager (None until the app has started)."""
        return self.room.manager if self.room is not None else None

    def _shape_problem(self, body: bytes, scope: Scope) -> tuple[str, int] | None:
        """What is wrong with ``body``'s shape, and its JSON-RPC code; None: nothing (a
        request's body and message then kept on the scope, ``PARSED``)."""
        if PARSED in scope:  # checked already
            return None
        problem, request = body_shape.read(body, self.bounds.body_elements)
        if request is not None:
            scope[PARSED] = (body, request)
        return problem

    async def _refuse_body(
        self,
        send: Send,
        client: Principal,
        status: int,
        message: str,
        code: int = INVALID_REQUEST,
        request_id: RequestId | None = None,
    ) -> None:
        refused("body", "refused an HTTP request of %s: %s", client.label, message, peer=client.label)
        await refuse(send, status, InvalidRequest(message, code), request_id=request_id)


CHECKS_REFUSED = "agent_gateway.checks_refused"
"""Scope key: why the modern lane's checks (the SDK entry's: headers, envelope, ``Mcp-Param``)
refused a request admission let in; admission records it as a refused call, as its own
refusals are (it took the client's rate-limit token; no span or handler ever sees it)."""

PARSED = "agent_gateway.parsed"
"""Scope key: a request's body and the JSON object it holds, as admission parsed it, for the
modern lane (``compat/exchange.py``), which would parse it again (it must check the body is the
same: a layer between may have changed it)."""


def _initializes(scope: Scope) -> bool:
    """Whether the request admitted is an ``initialize`` (as admission parsed it)."""
    return (parsed := scope.get(PARSED)) is not None and parsed[1].get("method") == "initialize"
