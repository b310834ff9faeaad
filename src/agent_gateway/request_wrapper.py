"""The one wrapper around every client request the gateway serves, entered once, first in
the low-level server's chain: the request's client identified (from its own token) and
bound, a name no catalog could hold refused (and, on stdio, the rate limit taken), its
SERVER span and duration metric, and, for a call, its record for the activity log and the
audit trail. What each of those means lives in its own module (``access``, ``telemetry``,
``call_records``, ``visibility``); this is where they meet the request, in one order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from pydantic import ValidationError

from agent_gateway import access
from agent_gateway.access import ANONYMOUS, AccessControl, Kind, Principal
from agent_gateway.call_records import CallRecorder
from agent_gateway.errors import AuditUnwritable, DrainEnded, GatewayError, to_wire
from agent_gateway.invalid_params import invalid_params
from agent_gateway.requested import Requested, UpstreamOf, requested
from agent_gateway.telemetry import RequestTelemetry
from agent_gateway.visibility import Visibility

Ending = Callable[[ServerRequestContext[Any, Any]], GatewayError | None]
"""Which requests to end, by the error each ends with (None: not this one)."""


class Drain:
    """The requests being served, for a drain (SIGTERM) to cut when its time is up, or a reload
    to end those its credential no longer admits: each then ends as an error saying so,
    answered to its client and recorded. Cut by uvicorn instead, a call's client got a bare
    500 (or its stream ended with no answer), the log a traceback per call, and the audit
    trail no record of most: they were cancelled after it closed."""

    def __init__(self) -> None:
        self.scopes: dict[anyio.CancelScope, ServerRequestContext[Any, Any]] = {}
        """Each request's scope, and the request."""
        self.why: str | None = None
        self.ended: dict[anyio.CancelScope, GatewayError] = {}
        """The requests ``end`` ended, and the error each ends with."""
        self.refused: Ending | None = None
        """Which requests to refuse as they begin: one whose credential a reload withdrew
        while its body was still arriving (admitted before it) is refused as it begins."""

    def cuttable(self, request: ServerRequestContext[Any, Any]) -> Cuttable:
        """Around ``request``: ``cut`` ends it with ``DrainEnded``, ``end`` with the error it
        gives."""
        return Cuttable(self, request)

    def cut(self, why: str) -> None:
        """End every request being served (and any begun later) with ``why``."""
        self.why = why
        for scope in self.scopes:
            scope.cancel()

    def end(self, ended: Ending) -> None:
        """End each request being served that ``ended`` gives an error for, with that error
        (``ended`` is not asked of one being ended already: a second reload does not count it
        again). One whose answer had already come may still be answered: its task is not
        woken to be cancelled."""
        for scope, request in list(self.scopes.items()):
            if scope not in self.ended and (error := ended(request)) is not None:
                self.ended[scope] = error
                scope.cancel()


class Cuttable:
    """One request's place in its ``Drain``: a class, not a generator (half the cost, ~5 us)."""

    __slots__ = ("_drain", "_request", "_scope")

    def __init__(self, drain: Drain, request: ServerRequestContext[Any, Any]) -> None:
        self._drain, self._request, self._scope = drain, request, anyio.CancelScope()

    def __enter__(self) -> None:
        if (refused := self._drain.refused) is not None and (error := refused(self._request)) is not None:
            raise to_wire(error)
        self._scope.__enter__()
        self._drain.scopes[self._scope] = self._request
        if self._drain.why is not None:
            self._scope.cancel()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        del self._drain.scopes[self._scope]
        ended = self._drain.ended.pop(self._scope, None)
        if self._scope.__exit__(
            kind, exc, tb
        ):  # the cancellation was its own: only ``cut`` and ``end`` send one
            raise to_wire(ended or DrainEnded(self._drain.why or "the gateway is shutting down"))


class RequestWrapper:
    """Low-level middleware: everything the gateway does once per client request."""

    def __init__(
        self,
        access_control: AccessControl,
        telemetry: RequestTelemetry,
        recorder: CallRecorder,
        visibility: Visibility,
        upstream_of: UpstreamOf,
        via: str | None = None,
        drain: Drain | None = None,
    ) -> None:
        """``upstream_of``: where a request goes, for its span and record (the catalog's
        lookup, once per request); ``via``: a tool that calls the tool named in its arguments
        (``call_tool``), spanned and recorded as that tool's call; ``drain``: what a stop cuts."""
        self.drain = drain or Drain()
        self._upstream_of = upstream_of
        self._via = via
        self._access = access_control
        self._telemetry = telemetry
        self._recorder = recorder
        self._visibility = visibility

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        # The same identification as the pipeline's: with none, listings show nothing.
        client = self._access.identify(ctx.request)
        if ctx.request_id is None:  # a notification: no request/response to span or record
            with access.bound(client):
                return await call_next(ctx)
        params = ctx.params or {}
        subject = client.subject if client is not None else ANONYMOUS
        request = requested(ctx.method, params, self._upstream_of, self._via)
        request = hidden_as_unknown(ctx.method, request, client)
        # In this order: the record carries the span's trace id; a refusal below is recorded.
        with (
            self._telemetry.spanned(ctx, params, request) as span,
            self._recorder.recording(ctx, request, subject) as record,
        ):
            access.admit(ctx, client)
            try:
                self._recorder.check_audited(ctx.method)
            except AuditUnwritable as exc:
                raise to_wire(exc) from None
            with access.bound(client), self.drain.cuttable(ctx):
                try:
                    result = await call_next(ctx)
                except ValidationError as exc:  # the SDK's check of the params, answered with no word
                    if (invalid := invalid_params(exc)) is None:
                        raise
                    raise to_wire(invalid) from None
            if ctx.method in _INTRODUCTIONS:
                result = self._visibility.introduced(result, client)
            span.answered(result)
            record.answered(result)
            return result


def hidden_as_unknown(method: str, request: Requested, client: Principal | None) -> Requested:
    """``request`` as its span, metric and record should see it: a name outside the client's
    policy as one the catalog does not hold (no upstream). Its refusal already reads the same
    either way; labelled with its upstream, ``/metrics`` (open to scrapers) told a client
    which hidden names exist (and, by their counts, which other clients call them)."""
    if request.upstream is None or client is None or request.target is None:
        return request
    if client.allows(_KINDS.get(method, "resource"), request.target):
        return request
    return replace(request, upstream=None)


_KINDS: dict[str, Kind] = {"tools/call": "tool", "prompts/get": "prompt"}
"""The kind of name each method names (every other one ``upstream_of`` knows names a resource)."""


_INTRODUCTIONS = frozenset({"initialize", "server/discover"})
"""The answers that carry the server's ``instructions``: a handshake-era client's handshake, and
what a modern-era client discovers instead."""
