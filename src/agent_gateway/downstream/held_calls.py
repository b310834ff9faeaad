"""A modern client's ``tools/call`` held across rounds, so that a handshake-era upstream can
ask it something.

A handshake-era upstream asks its client (sampling, elicitation, roots) in the middle of a
call and waits for the answer on the same call. A modern (2026-07-28) client is asked by an
``InputRequiredResult`` that ends its request, and answers by sending the request again with
``inputResponses`` and the ``requestState`` it was given. Between the two, the upstream's call
must live on: here it runs in a task of the gateway's own (``HeldCalls``), not the request's.

A call that asks nothing is answered by the request that made it, as any other. One that
asks is *held*: the request is answered with ``InputRequiredResult``, its ``requestState``
naming the held call; the retry carrying the answers finds it, hands each answer to the
upstream's waiting request, and waits again, for the result or the next question. Progress
and log lines go to whichever request of the call is current.

Bounds: a question waits ``ANSWER_TIMEOUT`` for its answer (then the upstream gets an error
for it, and the call is given up: cancelled upstream, as nobody would take its outcome); a
client has at most its ``max_concurrency`` calls waiting for its answers (and no more than
``PER_CLIENT``), an upstream's half its ``max_concurrency``, the gateway ``MAX_HELD``
(``held_bounds.py``); a retry must come from the client that made the call, for the same
tool (the SDK's seal of ``requestState`` binds both as well), one round at a time, its
answers each of its question's type. A call that ends between rounds (its timeout, its
upstream gone) gives the retry its own failure; until a retry takes its outcome (or
``ANSWER_TIMEOUT`` passes) it still counts against its client's bound, so a client that never
retries cannot pile up outcomes past it. A round cancelled by its client (the request's
stream closed) cancels the upstream call.

A held call lives on the replica that began it, and its ``requestState`` names that replica.
With several replicas (``store:``) a retry that reaches another is served by the holder over
the replicas' channels (``store/rounds.py``): its answers sent there, the round's progress, log
lines and outcome sent back, a hang-up passed on; a holder that is gone refuses it at once.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT
from pydantic import ValidationError

from agent_gateway.access import Principal
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.held_bounds import over_bound, upstream_room
from agent_gateway.downstream.held_rounds import Elsewhere, RoundRequest, Rounds, Start, ToolResult
from agent_gateway.downstream.input_requests import result_type, unsupported
from agent_gateway.errors import ClientLimited, InvalidArguments, UnknownRound
from agent_gateway.runtime import TaskHost
from agent_gateway.tally import held_rounds

logger = logging.getLogger(__name__)

ANSWER_TIMEOUT = 300.0
"""Seconds a held call's question waits for the client's retry carrying its answer."""
STATE_PREFIX = "agent-gateway/held/"
"""How a ``requestState`` of ours begins (any other is the upstream's own, passed through)."""


@dataclass(eq=False)
class _Question:
    request: types.InputRequest
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: types.InputResponse | None = None


@dataclass(eq=False)
class _Held:
    token: str
    tool: str
    client: str
    caller: RoundRequest
    """The current round's request: where progress and log lines go."""
    questions: dict[str, _Question] = field(default_factory=dict)
    """Asked and not yet answered, by the key the client answers them under."""
    changed: anyio.Event = field(default_factory=anyio.Event)
    """Set when a question is asked or the call ends; a round waits on it."""
    asked: bool = False
    """It has asked its client something: it counts against the bounds until its outcome is
    taken (or it is given up)."""
    upstream: str = ""
    """The upstream that asked it."""
    serving: bool = False
    """A round of it is being served (one at a time: a second would wait on nothing)."""
    done: bool = False
    result: ToolResult | None = None
    error: BaseException | None = None
    collected: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    keys: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def name(self) -> str:
        """How log lines name it: never its whole token, which would let a reader answer it."""
        return self.token.rpartition(".")[2][:8]


class HeldCaller:
    """The client side of a held call (``upstreams.client_side.ClientSide``): questions are
    held for the next round; progress and log lines go to the current round's request."""

    def __init__(self, held: _Held, calls: HeldCalls) -> None:
        self._held = held
        self._calls = calls

    @property
    def session_id(self) -> str:
        return self._held.caller.session_id

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return self._held.caller.log_level

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self._held.caller.capabilities

    @property
    def modern(self) -> bool:
        return True

    @property
    def lasting(self) -> HeldCaller:
        return self  # modern: nothing of it is kept for later (``upstreams/elicitations.py``)

    @property
    def input_responses(self) -> types.InputResponses | None:
        return None  # answered here, never passed to the handshake-era upstream

    @property
    def client_meta(self) -> Mapping[str, Any]:
        return self._held.caller.client_meta

    @property
    def request_state(self) -> str | None:
        return None

    def progress_relay(self) -> ProgressFnT | None:
        if self._held.caller.progress_token is None:
            return None  # as unheld: the upstream is sent no token the client did not send
        # The upstream's token is the first round's; its progress goes to the current round.

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            if (current := self._held.caller.progress_relay()) is not None:
                await current(progress, total, message)

        return relay

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        await self._held.caller.log(upstream, params)

    async def elicitation_complete(
        self, upstream: str, params: types.ElicitCompleteNotificationParams, *, during_call: bool
    ) -> None:
        return  # a held call's client is modern: it learns the outcome from its next round

    async def ask(self, upstream: str, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        held = self._held
        if (unable := unsupported(held.caller.capabilities, request)) is not None:
            return unable
        if not held.asked and (over := self._calls.over_bound(held.caller, upstream)) is not None:
            # Checked again here: calls let in side by side had asked nothing then.
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"agent-gateway: {over}")
        key = f"{request.method.split('/')[0]}-{next(held.keys)}"
        question = held.questions[key] = _Question(request)
        held.asked, held.upstream = True, upstream
        held.changed.set()
        logger.info("%s from %s held for the next round of call %s", request.method, upstream, held.name)
        try:
            with anyio.move_on_after(ANSWER_TIMEOUT):
                await question.answered.wait()
        finally:
            held.questions.pop(key, None)  # answered, timed out, or withdrawn: not asked again
        if question.answer is None and not held.done:
            # The client is gone, or will not answer: nobody would take the call's outcome either.
            held.scope.cancel()
            held_rounds.add(1, {"outcome": "unanswered"})
            logger.info("held call %s of %s given up: its client did not answer", held.name, held.tool)
        if question.answer is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"agent-gateway: the client did not answer {request.method} within {ANSWER_TIMEOUT:g}s",
            )
        return question.answer


class HeldCalls(TaskHost):
    """The held calls of this gateway process, run in its own task group."""

    def __init__(self, upstream_limit: Callable[[str], int | None] = lambda _: None) -> None:
        self._held: dict[str, _Held] = {}
        self.upstream_limit = upstream_limit
        """An upstream's ``max_concurrency`` (None: none, or no such upstream)."""
        self.replica = ""
        """This replica among several (its tokens begin with it); empty: the only one."""
        self.elsewhere: Rounds | None = None
        """Where rounds of calls other replicas hold are served (None: one replica)."""
        self._emptied: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._held)

    async def all_ended(self) -> None:
        """Until no call is held here (a drain waits for them, within its time)."""
        while self._held:
            self._emptied = anyio.Event()
            await self._emptied.wait()

    def _forget(self, token: str) -> None:
        self._held.pop(token, None)
        if not self._held and self._emptied is not None:
            self._emptied.set()

    def resumed(self, caller: Caller, tool: str) -> _Held | Elsewhere | None:
        """The held call ``caller``'s retry answers (None: it answers none of ours).

        Raises:
            UnknownRound: it names one of ours that is not held here (nor by another replica
                that could serve it), or not for this client and tool.
        """
        state = caller.request_state
        if state is None or not state.startswith(STATE_PREFIX):
            return None
        token = state.removeprefix(STATE_PREFIX)
        replica = token.partition(".")[0] if "." in token else ""
        if replica != self.replica and self.elsewhere is not None:
            return Elsewhere(replica, token, tool)
        client = caller.client.label if caller.client is not None else ""
        return self._held_for(token, client, tool)

    def _held_for(self, token: str, client: str, tool: str) -> _Held:
        held = self._held.get(token)
        if held is None or held.client != client or held.tool != tool:
            raise UnknownRound(tool)
        return held  # one done between rounds too: its retry takes its result, or its error

    async def serve(
        self, token: str, client: str, tool: str, request: Callable[[Principal | None], RoundRequest]
    ) -> ToolResult:
        """A round another replica was sent, for ``client``'s retry: ``request`` makes the
        round's request for the held call's own client (raises like ``round``)."""
        held = self._held_for(token, client, tool)
        return await self.round(held, request(held.caller.client))

    async def call(self, caller: Caller, tool: str, start: Start) -> ToolResult:
        """Make the call ``start`` begins, in a task of ours: its result, or the questions it
        asked as an ``InputRequiredResult``.

        Raises:
            ClientLimited: the client, or the gateway, holds its bound of calls.
        """
        if self._tg is None:  # stopping: not held, as before held calls
            return await start(caller)
        if (over := self.over_bound(caller)) is not None:
            raise ClientLimited(over)
        client = caller.client.label if caller.client is not None else ""
        secret = secrets.token_urlsafe(24)
        held = _Held(f"{self.replica}.{secret}" if self.replica else secret, tool, client, caller)
        self._held[held.token] = held
        self._tg.start_soon(self._run, held, start, name=f"held call {tool}")
        return await self.round(held, caller)

    async def round(self, held: _Held | Elsewhere, caller: RoundRequest) -> ToolResult:
        """One round of ``held``, for ``caller``'s request: its answers handed on, then the
        call's result, or the questions still unanswered."""
        if isinstance(held, Elsewhere):
            assert self.elsewhere is not None  # resumed gives one only then
            assert isinstance(caller, Caller)  # a client's own retry
            return await self.elsewhere.round(held, caller)
        if held.serving:
            raise ClientLimited("a round of this call is being served already; wait for its answer")
        self._answer(held, caller.input_responses or {})
        held.caller, held.serving = caller, True
        try:
            while not held.done and not held.questions:
                held.changed = anyio.Event()
                await held.changed.wait()
            # A cancel that came as the wait ended (a reload ending the round's request in the
            # step its question woke it) is not delivered by it: the call would stay held.
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            self._give_up(held, "given_up")  # the client gave the call up: so does the upstream
            logger.info("held call %s of %s given up: its round was cancelled", held.name, held.tool)
            raise
        finally:
            held.serving = False
        if held.done:
            held.collected.set()
            self._forget(held.token)
            held_rounds.add(1, {"outcome": "answered"})
            if held.error is not None:
                raise held.error
            assert held.result is not None
            return held.result
        asked = {key: question.request for key, question in held.questions.items()}
        held_rounds.add(1, {"outcome": "asked"})
        logger.info("held call %s of %s asks its client: %s", held.name, held.tool, ", ".join(asked))
        return types.InputRequiredResult(input_requests=asked, request_state=STATE_PREFIX + held.token)

    def over_bound(self, caller: RoundRequest, upstream: str | None = None) -> str | None:
        """Why ``caller``'s client may not have one more call waiting for its answers (None:
        it may, room made), ``upstream`` asking (``held_bounds.py``). Checked as a call begins
        and as it first asks: calls let in side by side had asked nothing then."""
        waiting = [held for held in self._held.values() if held.asked]
        if (over := over_bound(waiting, caller.client)) is not None or upstream is None:
            return over
        room = upstream_room(waiting, caller.client, upstream, self.upstream_limit(upstream))
        if isinstance(room, _Held):
            self._give_up(room, "made_way")
            who = caller.client.label if caller.client is not None else ""
            logger.warning(
                "held call %s of %s (%s) ended for %s's: it held more", room.name, room.tool, room.client, who
            )
            return None
        return room

    def give_up_of(self, clients: Collection[str]) -> int:
        """Give up the calls held for ``clients`` between rounds (a reload withdrew their
        tokens' secrets: no retry of theirs can come, and each would hold its upstream call and
        a place of its client's bound for ``ANSWER_TIMEOUT``); how many. A round being served
        is ended with its request."""
        given = [held for held in self._held.values() if held.client in clients and not held.serving]
        for held in given:
            self._give_up(held, "withdrawn")
            logger.info("held call %s of %s given up: its token was withdrawn", held.name, held.tool)
        return len(given)

    def _give_up(self, held: _Held, outcome: str) -> None:
        """End ``held``: cancelled upstream, its questions ended now, forgotten (its retry: unknown)."""
        held.scope.cancel()
        self._end(held)  # before its questions wake: they see a call ended, not one unanswered
        for question in held.questions.values():
            question.answered.set()
        self._forget(held.token)
        held.collected.set()  # nobody will: let the call's task end
        held_rounds.add(1, {"outcome": outcome})

    def _answer(self, held: _Held, answers: types.InputResponses) -> None:
        """Hand ``answers`` to the questions they answer, each checked first: one that is not
        its question's answer refuses them all, and none is handed on.

        Raises:
            InvalidArguments: an answer is not of its question's result type.
        """
        checked: list[tuple[str, _Question, types.InputResponse]] = []
        for key, answer in answers.items():
            question = held.questions.get(key)
            if question is None or question.answered.is_set():
                continue  # answered already, or never asked: nothing waits for it
            expected = result_type(question.request)
            try:
                dumped = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
                checked.append((key, question, expected.model_validate(dumped, by_name=False)))
            except ValidationError as exc:
                reason = f"the answer to {key!r} is not a {question.request.method} result: {exc.error_count()} error(s)"
                raise InvalidArguments(held.tool, reason) from exc
        for key, question, answer in checked:
            question.answer = answer
            question.answered.set()
            held.questions.pop(key, None)  # answered now, not asked again this round

    async def _run(self, held: _Held, start: Start) -> None:
        try:
            with held.scope:
                try:
                    held.result = await start(HeldCaller(held, self))
                except Exception as exc:  # raised in the round that takes it, as if never held
                    held.error = exc
            del start  # the call's arguments: not kept while its outcome waits
            self._end(held)
            with anyio.move_on_after(ANSWER_TIMEOUT):  # until a round takes the outcome
                await held.collected.wait()
        finally:  # the gateway stopping cancels it anywhere: a waiting round still wakes
            self._end(held)
            self._forget(held.token)

    @staticmethod
    def _end(held: _Held) -> None:
        if held.done:
            return
        if held.result is None and held.error is None:  # cancelled: given up, or stopping
            held.error = UnknownRound(held.tool)
        held.done = True
        held.changed.set()
