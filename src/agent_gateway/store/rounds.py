"""A held call's rounds across replicas (``downstream/held_calls.py``).

A modern client's call that a handshake-era upstream asks something is held by the replica
that began it, and its ``requestState`` names that replica. Behind a balancer the client's
retry, carrying its answers, may reach another. That replica (the *asking* one) sends the
round to the holder on the holder's own channel (``rounds:<replica>``), and the holder serves
it as it serves a retry of its own: the answers handed to the upstream's waiting questions,
then the call's result or its next questions. What the round sends meanwhile (progress, log
lines) and its outcome come back on the asking replica's channel, to the request waiting
there; a client that hangs up there gives the call up on the holder too.

Pub/sub delivers to whoever listens now, so a holder that is gone is known at once (nobody
received the round: refused as not held). One that dies during a round is noticed by its
heartbeat (``store/holders.py``), checked every ``_CHECK_EVERY`` seconds while the round
waits. Nothing is written to the store: a round lives as long as the request waiting for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.dispatcher import ProgressFnT
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind
from pydantic import TypeAdapter, ValidationError

from agent_gateway.access import Principal
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.held_calls import Elsewhere, HeldCalls, ToolResult
from agent_gateway.errors import GatewayError, InvalidArguments, ReplicaError, UnknownRound
from agent_gateway.store import SharedState
from agent_gateway.store import rounds_channel as channel
from agent_gateway.store.bus import Bus
from agent_gateway.tally import held_rounds
from agent_gateway.telemetry import SCOPE
from agent_gateway.trace_context import tracing

logger = logging.getLogger(__name__)

_CHECK_EVERY = 3.0
"""Seconds between checks, while a round waits, that its holder is still alive."""
_BACKLOG = 64
"""Progress and log lines waiting to be passed to the client; more are dropped."""
_tracer = trace.get_tracer(SCOPE)
_OUTCOME: TypeAdapter[ToolResult] = TypeAdapter(ToolResult)
_ANSWERS: TypeAdapter[types.InputResponses] = TypeAdapter(types.InputResponses)


@dataclass(eq=False)
class _Waiting:
    """A round this replica asked another for: its client's request, and what came back."""

    send: MemoryObjectSendStream[dict[str, Any]]
    receive: MemoryObjectReceiveStream[dict[str, Any]]
    outcome: dict[str, Any] | None = None


@dataclass(eq=False)
class _Reply:
    """What goes back to the asking replica for one round, in the order it is said: a log
    line's relay still sending when the call ends goes before its outcome."""

    bus: Bus
    channel: str
    nonce: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    async def send(self, message: dict[str, Any]) -> None:
        async with self.lock:
            await self.bus.publish(self.channel, json.dumps({**message, "id": self.nonce}))


@dataclass(eq=False)
class _Served:
    """A round this replica serves for another's request."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class Rounds:
    """Rounds of held calls between the replicas: asked for here, or served here (in the held
    calls' own task group, so they end with them)."""

    def __init__(self, shared: SharedState, calls: HeldCalls) -> None:
        """Rounds of ``calls``, over ``shared``'s channels; ``calls`` then name this replica in
        their tokens and send here the rounds of calls held elsewhere."""
        self._bus = shared.bus
        self._holders = shared.holders
        self._replica = shared.replica
        self._calls = calls
        self._waiting: dict[str, _Waiting] = {}
        self._served: dict[str, _Served] = {}
        calls.replica, calls.elsewhere = shared.replica, self
        shared.bus.on(channel(shared.replica), self._heard)

    # -- asked for here ----------------------------------------------------------------------

    async def round(self, elsewhere: Elsewhere, caller: Caller) -> ToolResult:
        """``caller``'s round of the call ``elsewhere.replica`` holds, served there.

        Raises:
            UnknownRound: no replica holds it (its holder is gone, or never was), or it is not
                this client's or tool's there; ``ReplicaError``: the holder's error for it.
        """
        nonce = secrets.token_hex(8)
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](_BACKLOG)
        waiting = self._waiting[nonce] = _Waiting(send, receive)
        try:
            with _span(elsewhere.tool, SpanKind.CLIENT, elsewhere.replica):
                carrier: dict[str, str] = {}
                propagate.inject(carrier)  # the holder's span of the round is this one's child
                asked = _asked(nonce, self._replica, elsewhere, caller, carrier)
                if not await self._bus.publish(channel(elsewhere.replica), asked):
                    held_rounds.add(1, {"outcome": "holder_gone"})  # nobody listens on its channel
                    raise UnknownRound(elsewhere.tool)
                held_rounds.add(1, {"outcome": "sent_across"})
                logger.info(
                    "held call of %s: its round sent to replica %s", elsewhere.tool, elsewhere.replica
                )
                await self._relay(waiting, caller, elsewhere)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), contextlib.suppress(GatewayError):
                # The client gave the call up: so does its holder (bounded by the store's timeout).
                await self._bus.publish(channel(elsewhere.replica), json.dumps({"op": "cancel", "id": nonce}))
            raise
        finally:
            del self._waiting[nonce]
            send.close()
            receive.close()
        return _outcome_of(waiting.outcome or {}, elsewhere.tool)

    async def _relay(self, waiting: _Waiting, caller: Caller, elsewhere: Elsewhere) -> None:
        """Pass the round's progress and log lines to ``caller`` until its outcome comes (the
        stream ends), checking meanwhile that the holder lives."""
        while True:
            message: dict[str, Any] | None = None
            with anyio.move_on_after(_CHECK_EVERY):
                try:
                    message = await waiting.receive.receive()
                except anyio.EndOfStream:
                    return
            if message is None:  # quiet for a while: is the holder still there?
                if not await self._holders.alive(elsewhere.replica):
                    held_rounds.add(1, {"outcome": "holder_gone"})
                    logger.warning(
                        "held call of %s: replica %s died during its round", elsewhere.tool, elsewhere.replica
                    )
                    raise UnknownRound(elsewhere.tool)
                continue
            await _pass_on(message, caller)

    # -- served here -------------------------------------------------------------------------

    async def _serve(self, asked: dict[str, Any]) -> None:
        nonce = str(asked["id"])
        reply = _Reply(self._bus, channel(str(asked["from"])), nonce)
        served = self._served[nonce] = _Served()
        parent = propagate.extract(asked.get("trace") or {})
        try:
            with served.scope, _span(str(asked.get("tool")), SpanKind.SERVER, self._replica, parent):
                outcome = await self._outcome(asked, reply)
                await reply.send(outcome)
        except GatewayError as exc:  # the store is out of reach: the asking replica sees it too
            logger.warning("held call of %s: its round's outcome not sent back: %s", asked.get("tool"), exc)
        finally:
            del self._served[nonce]

    async def _outcome(self, asked: dict[str, Any], reply: _Reply) -> dict[str, Any]:
        try:
            answers = _ANSWERS.validate_python(asked.get("answers") or {})
            result = await self._calls.serve(
                str(asked["token"]),
                str(asked["client"]),
                str(asked["tool"]),
                lambda client: _Remote(reply, asked, answers, client),
            )
        except ValidationError as exc:
            error: GatewayError = InvalidArguments(
                str(asked.get("tool")), f"answers not understood: {exc.error_count()} error(s)"
            )
            return {"op": "error", "code": error.code, "message": str(error)}
        except GatewayError as exc:
            return {"op": "error", "code": exc.code, "message": str(exc)}
        except Exception:  # as the SDK's boundary does for a local round: nothing internal shown
            logger.exception("held call of %s: serving another replica's round failed", asked.get("tool"))
            return {"op": "error", "code": types.INTERNAL_ERROR, "message": "internal error"}
        return {"op": "outcome", "result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}

    # -- the channel -------------------------------------------------------------------------

    async def _heard(self, text: str) -> None:
        """One message on this replica's channel (the bus awaits it: nothing here waits)."""
        message = json.loads(text)
        nonce, op = str(message.get("id")), message.get("op")
        if op == "round":
            self._calls.start_soon(self._serve, message, name=f"round of {message.get('tool')}")
        elif op == "cancel":
            if (served := self._served.get(nonce)) is not None:
                served.scope.cancel()
        elif (waiting := self._waiting.get(nonce)) is not None:
            if op in ("outcome", "error"):
                waiting.outcome = message
                waiting.send.close()  # what came before it is still read, then the stream ends
            else:
                # A line or progress report more than the client reads is dropped.
                with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                    waiting.send.send_nowait(message)


class _Remote:
    """The request of a round another replica was sent (``held_calls.RoundRequest``): what it
    told of its client's request, and progress and log lines sent back to it."""

    def __init__(
        self, reply: _Reply, asked: dict[str, Any], answers: types.InputResponses, client: Principal | None
    ) -> None:
        self._reply = reply
        self._asked = asked
        self.input_responses: types.InputResponses | None = answers
        self.client = client
        self.progress_token: types.ProgressToken | None = reply.nonce if asked.get("progress") else None
        capabilities = asked.get("capabilities")
        self.capabilities = (
            None if capabilities is None else types.ClientCapabilities.model_validate(capabilities)
        )

    @property
    def session_id(self) -> str:
        return str(self._asked.get("session", ""))

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return self._asked.get("log_level")

    @property
    def modern(self) -> bool:
        return True

    @property
    def request_state(self) -> str | None:
        return None

    def progress_relay(self) -> ProgressFnT | None:
        if self.progress_token is None:
            return None

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            await self._reply.send(
                {"op": "progress", "progress": progress, "total": total, "message": message}
            )

        return relay

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        line = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        await self._reply.send({"op": "log", "upstream": upstream, "params": line})

    async def ask(self, upstream: str, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        # Never asked: a held call's questions are held for its next round (held_calls.HeldCaller).
        return types.ErrorData(code=types.INVALID_REQUEST, message="agent-gateway: not asked across replicas")


def _span(
    tool: str, kind: SpanKind, holder: str, parent: Context | None = None
) -> AbstractContextManager[object]:
    """A round's span on either replica (none while no tracer provider is installed)."""
    if not tracing():
        return contextlib.nullcontext()
    attributes = {"gen_ai.tool.name": tool, "agent_gateway.replica.holder": holder}
    return _tracer.start_as_current_span(f"held_call.round {tool}", parent, kind, attributes)


def _asked(nonce: str, replica: str, elsewhere: Elsewhere, caller: Caller, carrier: dict[str, str]) -> str:
    """The round as sent to its holder: the retry's answers and what the round's request is."""
    answers = {
        key: answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        for key, answer in (caller.input_responses or {}).items()
    }
    capabilities = caller.capabilities
    return json.dumps(
        {
            "op": "round",
            "id": nonce,
            "from": replica,
            "token": elsewhere.token,
            "tool": elsewhere.tool,
            "client": caller.client.label if caller.client is not None else "",
            "session": caller.session_id,
            "answers": answers,
            "capabilities": None
            if capabilities is None
            else capabilities.model_dump(by_alias=True, mode="json", exclude_none=True),
            "log_level": caller.log_level,
            "progress": caller.progress_token is not None,
            "trace": carrier,
        }
    )


async def _pass_on(message: dict[str, Any], caller: Caller) -> None:
    """A progress report or log line of the round, to the client's request."""
    if message.get("op") == "progress":
        if (relay := caller.progress_relay()) is not None:
            await relay(float(message["progress"]), message.get("total"), message.get("message"))
    elif message.get("op") == "log":
        params = types.LoggingMessageNotificationParams.model_validate(message["params"])
        await caller.log(str(message.get("upstream", "")), params)


def _outcome_of(message: dict[str, Any], tool: str) -> ToolResult:
    """The round's result, or its error raised (none came: the round was not served)."""
    if message.get("op") == "outcome":
        return _OUTCOME.validate_python(message["result"], by_name=False)
    if message.get("op") == "error":
        raise ReplicaError(int(message["code"]), str(message["message"]))
    raise UnknownRound(tool)
