"""What an upstream sends during a call besides its answer: log lines, progress, and sampling,
elicitation and roots requests, relayed to the downstream client whose call caused them.

An upstream's messages say nothing about which of our calls caused them (JSON-RPC has no
"related request" field), so they are attributed by what is in flight: to the caller named
by the context the ``mcp`` client runs the callback in, to the one downstream session with
calls on this upstream session, to the owner of a dedicated (``per_client``) session, or,
for log lines nobody's call can own, to every client.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import get_args

import mcp_types as types
from mcp.client.session import ClientRequestContext
from mcp.shared.dispatcher import ProgressFnT

from agent_gateway.errors import UpstreamAnswered, cut_client_error
from agent_gateway.tally import notifications_dropped
from agent_gateway.upstreams.asking import asked_by, listing_by
from agent_gateway.upstreams.client_side import ClientSide
from agent_gateway.upstreams.elicitations import Elicitations

logger = logging.getLogger(__name__)

Broadcast = Callable[[str, types.LoggingMessageNotificationParams], Awaitable[None]]
MAX_PASSING = 64
"""Log lines and progress reports of one upstream session passed on to one downstream session at
once; more of its are dropped. The SDK's client starts a task for each notification and each
waits until its client takes it: an upstream sending faster than its clients read held every one
in memory. Counted per downstream session (``Replies._passing``): counted for the upstream
session alone, a client that read nothing held every slot, and every other client's reports and
lines were dropped."""
MAX_PASSING_ALL = 16 * MAX_PASSING
"""The same for all of one upstream session's clients together: what it holds stays bounded
whatever the number of its calls in flight."""

_CALLER: contextvars.ContextVar[ClientSide | None] = contextvars.ContextVar(
    "agent_gateway_caller", default=None
)
"""The caller of the upstream call this task is making. The ``mcp`` client runs callbacks
for requests sent on a call's own HTTP stream, and a modern upstream's input requests, in
a copy of the caller's context: there, this names the caller exactly."""


class Replies:
    """One upstream session's calls in flight, and the relays of what the upstream sends."""

    def __init__(self, name: str, owner: ClientSide | None, broadcast: Broadcast | None) -> None:
        self.name = name
        self.owner = owner
        self._broadcast = broadcast
        self._in_flight: dict[int, ClientSide] = {}
        self._tokens = itertools.count()
        self._passing: dict[str, int] = {}
        """Log lines and progress reports of this session being passed on now, per downstream
        session (its id); ``_passing_all`` in all."""
        self._passing_all = 0
        self._progress: dict[str, ProgressFnT] = {}
        """The relays of requests sent with a progress token of ours (``progress_token``)."""
        self._elicitations = Elicitations()
        """The URL elicitations this session showed clients, under ids of ours."""

    @property
    def pending(self) -> int:
        """Calls in flight on this session."""
        return len(self._in_flight)

    @contextmanager
    def calling(self, caller: ClientSide | None) -> Iterator[None]:
        """One call by ``caller`` in flight: what the upstream sends meanwhile may be theirs."""
        token = next(self._tokens)
        if caller is not None:
            self._in_flight[token] = caller
        bound = _CALLER.set(caller)
        try:
            yield
        except UpstreamAnswered as exc:
            if exc.code == types.URL_ELICITATION_REQUIRED and caller is not None:  # ids of ours, named
                exc.data = listing_by(self.name, self._elicitations.error_data(exc.data, caller))
            raise
        finally:
            _CALLER.reset(bound)
            self._in_flight.pop(token, None)
            if caller is not None and caller.session_id in self._elicitations.shown_to:  # rarely
                self._elicitations.call_ended(caller)

    def attributed(self) -> ClientSide | None:
        """The one downstream session this session's traffic can belong to, if there is one:
        a question (sampling, elicitation, roots) goes there, or is refused."""
        if (exact := _CALLER.get()) is not None:
            return exact
        callers = {c.session_id: c for c in self._in_flight.values()}
        if len(callers) == 1:
            return next(iter(callers.values()))
        if not callers:
            return self.owner
        return None

    def _log_target(self, level: types.LoggingLevel) -> ClientSide | None:
        """Where a log line goes: as ``attributed``, but on a dedicated session, whose calls
        are all its owner's client's (a standing owner's: several of its modern requests,
        which no question may be guessed between), the oldest request that wants the line."""
        if (target := self.attributed()) is not None or self.owner is None:
            return target
        return next((c for c in self._in_flight.values() if _wants(c.log_level, level)), None)

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        # Chosen before any await: the call may finish right after its last log line.
        target = self._log_target(params.level)
        if target is not None:
            with self._passing_on("log", target) as passing:
                if passing:
                    await target.log(self.name, params)
        elif not self._in_flight and self._broadcast is not None:
            await self._broadcast(self.name, params)  # returns at once (downstream/broadcast.py)
        else:
            logger.debug("log line from %s dropped: several clients have calls in flight", self.name)

    def progress_relay(self, caller: ClientSide | None) -> ProgressFnT | None:
        """``caller``'s progress relay, passing on at most ``MAX_PASSING`` of this session's
        reports and log lines for it at once (the SDK's client starts a task for each)."""
        if caller is None or (relay := caller.progress_relay()) is None:
            return None

        async def passed_on(progress: float, total: float | None, message: str | None) -> None:
            with self._passing_on("progress", caller) as passing:
                if passing:
                    await relay(progress, total, message)

        return passed_on

    @contextmanager
    def progress_token(self, caller: ClientSide | None) -> Iterator[str | None]:
        """A progress token of ours for a request whose SDK method takes no progress callback
        (``prompts/get``, ``resources/read``), when ``caller`` asked for progress: the reports
        carrying it go to ``caller`` (``on_progress``) until the request ends. Random, and not
        a number (the SDK's client takes a number for one of its own requests' ids)."""
        relay = self.progress_relay(caller)
        if relay is None:
            yield None
            return
        token = f"gw-{secrets.token_hex(8)}"
        self._progress[token] = relay
        try:
            yield token
        finally:
            del self._progress[token]

    async def on_progress(self, params: types.ProgressNotificationParams) -> None:
        """A progress report the SDK's client had no callback for: its request's, if ours."""
        if isinstance(params.progress_token, str) and (relay := self._progress.get(params.progress_token)):
            await relay(params.progress, params.total, params.message)

    @contextmanager
    def _passing_on(self, kind: str, target: ClientSide) -> Iterator[bool]:
        """Whether one more line or report may be passed on to ``target`` now; counted in
        ``_passing`` while it is, when it may."""
        key = target.session_id
        passing = self._passing.get(key, 0)
        if passing >= MAX_PASSING or self._passing_all >= MAX_PASSING_ALL:
            notifications_dropped.add(1, {"kind": kind, "why": "backlog"})
            logger.warning(
                "%s from %s dropped: %d are being passed on already (%s)",
                kind,
                self.name,
                passing if passing >= MAX_PASSING else self._passing_all,
                "its client reads slower than it sends"
                if passing >= MAX_PASSING
                else "its clients read slower than it sends",
            )
            yield False
            return
        self._passing[key] = passing + 1
        self._passing_all += 1
        try:
            yield True
        finally:
            self._passing_all -= 1
            if (left := self._passing[key] - 1) > 0:
                self._passing[key] = left
            else:
                del self._passing[key]

    async def on_elicitation_complete(self, params: types.ElicitCompleteNotificationParams) -> None:
        """A URL-mode elicitation finished: told to each client this session showed its id,
        under the id it was shown (during the call it was asked in, if that is still going
        on); an id it showed nobody is dropped (``elicitations.py``)."""
        told = self._elicitations.completed(params.elicitation_id)
        if not told:
            notifications_dropped.add(1, {"kind": "elicitation_complete", "why": "unknown"})
            logger.debug(
                "elicitation/complete from %s dropped: it showed no handshake-era client that id", self.name
            )
        for shown, target in told:
            during = any(caller is target for caller in self._in_flight.values())
            said = params.model_copy(update={"elicitation_id": shown})
            await target.elicitation_complete(self.name, said, during_call=during)

    def showed(self, session_id: str) -> bool:
        """Whether this session keeps URL elicitations it showed ``session_id``."""
        return self._elicitations.showed(session_id)

    def client_ended(self, session_id: str) -> None:
        """Downstream session ``session_id`` ended: nothing of it is kept for its completions."""
        self._elicitations.ended(session_id)

    async def on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        answer = await self._relay(types.CreateMessageRequest(params=params))
        if isinstance(
            answer, types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData
        ):
            return answer
        return _wrong_answer("sampling/createMessage")

    async def on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        answer = await self._relay(types.ElicitRequest(params=params))
        if isinstance(answer, types.ElicitResult | types.ErrorData):
            return answer
        return _wrong_answer("elicitation/create")

    async def on_roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        answer = await self._relay(types.ListRootsRequest())
        if isinstance(answer, types.ListRootsResult | types.ErrorData):
            return answer
        return _wrong_answer("roots/list")

    async def _relay(self, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        target = self.attributed()
        asked = target is not None and not target.modern  # a modern client is asked only by a call
        if not asked and not self._in_flight and isinstance(request, types.ListRootsRequest):
            # Many servers ask right after connecting, when no client is there to ask: no roots.
            logger.debug("roots/list from %s with no client call in flight: no roots", self.name)
            return types.ListRootsResult(roots=[])
        if target is None:
            reason = self._unattributed()
            logger.warning("%s from %s refused: %s", request.method, self.name, reason)
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"agent-gateway: {reason}")
        answer = await target.ask(self.name, asked_by(self.name, self._elicitations.asked(request, target)))
        return cut_client_error(answer) if isinstance(answer, types.ErrorData) else answer

    def _unattributed(self) -> str:
        """Why a question on this session has nobody to ask."""
        if not self._in_flight:
            return "no client call is in flight to answer it"
        if self.owner is None:
            return (
                "several clients have calls in flight on this shared upstream session "
                "(configure `session: per_client` for this upstream)"
            )
        return "several requests of its client have calls in flight on it, and whose call asks is unknown"


_LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
"""The log levels, least severe first (as MCP lists them)."""


def _wants(threshold: types.LoggingLevel | None, level: types.LoggingLevel) -> bool:
    """Whether a client side asking for lines from ``threshold`` up (None: none) wants ``level``."""
    return threshold is not None and _LEVELS.index(level) >= _LEVELS.index(threshold)


def _wrong_answer(method: str) -> types.ErrorData:
    return types.ErrorData(
        code=types.INTERNAL_ERROR,
        message=f"agent-gateway: the client's answer to {method} has the wrong shape",
    )
