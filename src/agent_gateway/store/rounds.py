"""A held call's rounds across replicas (``downstream/held_calls.py``).

A modern client's call that a handshake-era upstream asks something is held by the replica
that began it, and its ``requestState`` names that replica. Behind a balancer the client's
retry, carrying its answers, may reach another. That replica (the *asking* one) sends the
round to the holder on the holder's own channel (``rounds:<replica>``), and the holder serves
it as it serves a retry of its own: the answers handed to the upstream's waiting questions,
then the call's result or its next questions. What the round sends meanwhile (progress, log
lines) and its outcome come back on the asking replica's channel, to the request waiting
there; a client that hangs up there, or a round that ends there for any other reason before
its outcome, gives the call up on the holder too. The messages: ``store/round_messages.py``.

Pub/sub delivers to whoever listens now, so a holder that is gone is known at once (nobody
received the round: refused as not held). While it serves a round it says so every
``KEEPALIVE`` seconds; a round that hears nothing for ``_SILENCE`` (its holder died, its
outcome was lost on the way, the store went away) is ended there. Nothing is written to the
store: a round lives as long as the request waiting for it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.dispatcher import ProgressFnT
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from agent_gateway.access import Principal
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.held_calls import HeldCalls
from agent_gateway.downstream.held_rounds import Elsewhere, ToolResult
from agent_gateway.errors import GatewayError, ReplicaError, StoreUnavailable, UnknownRound
from agent_gateway.meta_keys import NO_META
from agent_gateway.store.bus import Bus
from agent_gateway.store.round_messages import (
    KEEPALIVE,
    Asked,
    Cancel,
    Failed,
    Log,
    Outcome,
    Progress,
    Serving,
    parsed,
    said,
)
from agent_gateway.tally import held_rounds
from agent_gateway.telemetry import SCOPE
from agent_gateway.trace_context import tracing

if TYPE_CHECKING:
    from agent_gateway.store.state import SharedState

logger = logging.getLogger(__name__)

_SILENCE = 3 * KEEPALIVE
"""Seconds a round waits without a word from its holder before it is ended."""
_BACKLOG = 64
"""Progress and log lines waiting to be passed to the client; more are dropped."""
_tracer = trace.get_tracer(SCOPE)

Said = Serving | Progress | Log
"""What a holder says during a round."""


def rounds_channel(replica: str) -> str:
    """The channel of ``replica``'s held calls' rounds."""
    return f"rounds:{replica}"


@dataclass(eq=False)
class _Waiting:
    """A round this replica asked another for: what came back for its client's request."""

    send: MemoryObjectSendStream[Said]
    receive: MemoryObjectReceiveStream[Said]
    outcome: Outcome | Failed | None = None


@dataclass(eq=False)
class _Reply:
    """What goes back to the asking replica for one round, in the order it is said (a log
    line's relay still sending when the call ends goes before its outcome); nothing once the
    round has ended."""

    bus: Bus
    channel: str
    nonce: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    ended: bool = False

    async def send(self, message: Serving | Progress | Log | Outcome | Failed) -> bool:
        """Whether ``message`` went out (not when the round has ended, or the store failed)."""
        async with self.lock:
            return not self.ended and await self.bus.publish(self.channel, said(message)) is not None


class Rounds:
    """Rounds of held calls between the replicas: asked for here, or served here (in the held
    calls' own task group, so they end with them)."""

    def __init__(self, shared: SharedState, calls: HeldCalls) -> None:
        """Rounds of ``calls``, over ``shared``'s channels; ``calls`` then name this replica in
        their tokens and send here the rounds of calls held elsewhere."""
        self._bus = shared.bus
        self._replica = shared.replica
        self._calls = calls
        self._waiting: dict[str, _Waiting] = {}
        self._served: dict[tuple[str, str], anyio.CancelScope] = {}
        """The rounds served here for other replicas' requests, by (asking replica, round)."""
        calls.replica, calls.elsewhere = shared.replica, self
        shared.bus.on(rounds_channel(shared.replica), self._heard)

    # -- asked for here ----------------------------------------------------------------------

    async def round(self, elsewhere: Elsewhere, caller: Caller) -> ToolResult:
        """``caller``'s round of the call ``elsewhere.replica`` holds, served there.

        Raises:
            UnknownRound: no replica holds it (its holder is gone, or never was), it is not
                this client's or tool's there, or its holder fell silent; ``ReplicaError``: the
                holder's error for it; ``StoreUnavailable``: the store cannot carry it.
        """
        nonce = secrets.token_hex(8)
        send, receive = anyio.create_memory_object_stream[Said](_BACKLOG)
        waiting = self._waiting[nonce] = _Waiting(send, receive)
        try:
            with _span(elsewhere.tool, SpanKind.CLIENT, elsewhere.replica):
                await self._send(nonce, elsewhere, caller)
                await self._relay(waiting, caller, elsewhere)
        except BaseException:
            if waiting.outcome is None:  # ended here first (a hang-up, a failure): so it is there
                with anyio.CancelScope(shield=True):  # bounded by the store's timeout
                    await self._bus.publish(
                        rounds_channel(elsewhere.replica), said(Cancel(id=nonce, sender=self._replica))
                    )
            raise
        finally:
            del self._waiting[nonce]
            send.close()
            receive.close()
        return _outcome_of(waiting.outcome, elsewhere.tool)

    async def _send(self, nonce: str, elsewhere: Elsewhere, caller: Caller) -> None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # the holder's span of the round is this one's child
        heard = await self._bus.publish(
            rounds_channel(elsewhere.replica), said(_asked(nonce, self._replica, elsewhere, caller, carrier))
        )
        if heard is None:
            raise StoreUnavailable(
                "the shared store cannot be reached: the round of this held call cannot be sent to the replica holding it; retry"
            )
        if not heard:  # nobody listens on its channel: the replica is gone
            held_rounds.add(1, {"outcome": "holder_gone"})
            raise UnknownRound(elsewhere.tool)
        held_rounds.add(1, {"outcome": "sent_across"})
        logger.info("held call of %s: its round sent to replica %s", elsewhere.tool, elsewhere.replica)

    async def _relay(self, waiting: _Waiting, caller: Caller, elsewhere: Elsewhere) -> None:
        """Pass the round's progress and log lines to ``caller`` until its outcome comes (the
        stream ends), or its holder falls silent."""
        while True:
            message: Said | None = None
            with anyio.move_on_after(_SILENCE):
                try:
                    message = await waiting.receive.receive()
                except anyio.EndOfStream:
                    return
            if message is None:
                held_rounds.add(1, {"outcome": "holder_gone"})
                logger.warning(
                    "held call of %s: replica %s fell silent during its round",
                    elsewhere.tool,
                    elsewhere.replica,
                )
                raise UnknownRound(elsewhere.tool)
            await _pass_on(message, caller)

    # -- served here -------------------------------------------------------------------------

    async def _serve(self, asked: Asked, served: anyio.CancelScope) -> None:
        """Serve ``asked`` and send its outcome back; nothing escapes (this runs in the held
        calls' task group, beside every call this replica holds)."""
        reply = _Reply(self._bus, rounds_channel(asked.sender), asked.id)
        parent = propagate.extract(asked.trace)
        try:
            with served, _span(asked.tool, SpanKind.SERVER, self._replica, parent):
                async with anyio.create_task_group() as tg:
                    alive = anyio.CancelScope()  # the asking replica told it is being served
                    tg.start_soon(_keep_alive, reply, alive)
                    outcome = await self._outcome(asked, reply)
                    alive.cancel()
                    if not await reply.send(outcome):
                        logger.warning(
                            "held call of %s: its round's outcome not sent back (the store failed)",
                            asked.tool,
                        )
        except Exception:  # its outcome not sent: the asking replica ends the round on silence
            logger.exception(
                "held call of %s: the round served for replica %s failed", asked.tool, asked.sender
            )
        finally:
            reply.ended = True
            if self._served.get((asked.sender, asked.id)) is served:
                del self._served[(asked.sender, asked.id)]

    async def _outcome(self, asked: Asked, reply: _Reply) -> Outcome | Failed:
        try:
            result = await self._calls.serve(
                asked.token, asked.client, asked.tool, lambda client: _Remote(reply, asked, client)
            )
        except GatewayError as exc:
            return Failed(id=asked.id, code=exc.code, message=str(exc))
        except Exception:  # as the SDK's boundary does for a local round: nothing internal shown
            logger.exception("held call of %s: serving another replica's round failed", asked.tool)
            return Failed(id=asked.id, code=types.INTERNAL_ERROR, message="internal error")
        return Outcome(id=asked.id, result=result)

    # -- the channel -------------------------------------------------------------------------

    async def _heard(self, text: str) -> None:
        """One message on this replica's channel (the bus awaits it: nothing here waits long)."""
        match parsed(text):
            case Asked() as asked:
                await self._asked_here(asked)
            case Cancel(id=nonce, sender=sender):
                if (served := self._served.get((sender, nonce))) is not None:
                    served.cancel()
            case Outcome() | Failed() as outcome:
                if (waiting := self._waiting.get(outcome.id)) is not None:
                    waiting.outcome = outcome
                    waiting.send.close()  # what came before it is still read, then the stream ends
            case Serving() | Progress() | Log() as message:
                if (waiting := self._waiting.get(message.id)) is not None:
                    # A line or progress report more than the client reads is dropped.
                    with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                        waiting.send.send_nowait(message)
            case None:
                pass

    async def _asked_here(self, asked: Asked) -> None:
        """Start serving ``asked``, once (registered before it starts: a cancel right behind it
        finds it); refused at once while held calls are stopping."""
        key = (asked.sender, asked.id)
        if key in self._served:
            logger.warning("held call of %s: a round heard twice, served once", asked.tool)
            return
        served = self._served[key] = anyio.CancelScope()
        logger.info("held call of %s: serving a round for replica %s", asked.tool, asked.sender)
        if not self._calls.start_soon(self._serve, asked, served, name=f"round of {asked.tool}"):
            del self._served[key]
            stopping = "the replica holding this call is stopping: call the tool again"
            await _Reply(self._bus, rounds_channel(asked.sender), asked.id).send(
                Failed(id=asked.id, code=types.INTERNAL_ERROR, message=stopping)
            )


async def _keep_alive(reply: _Reply, alive: anyio.CancelScope) -> None:
    """Say the round is still being served, every ``KEEPALIVE`` seconds, until ``alive`` is
    cancelled."""
    with alive:
        while True:
            await anyio.sleep(KEEPALIVE)
            await reply.send(Serving(id=reply.nonce))


class _Remote:
    """The request of a round another replica was sent (``held_rounds.RoundRequest``): what it
    told of its client's request, and progress and log lines sent back to it."""

    def __init__(self, reply: _Reply, asked: Asked, client: Principal | None) -> None:
        self._reply = reply
        self._asked = asked
        self.input_responses: types.InputResponses | None = asked.answers
        self.client = client
        self.progress_token: types.ProgressToken | None = reply.nonce if asked.progress else None
        self.capabilities = asked.capabilities

    @property
    def session_id(self) -> str:
        return self._asked.session

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return self._asked.log_level

    @property
    def modern(self) -> bool:
        return True

    @property
    def lasting(self) -> _Remote:
        return self  # modern: nothing of it is kept for later (``upstreams/elicitations.py``)

    @property
    def request_state(self) -> str | None:
        return None

    @property
    def client_meta(self) -> Mapping[str, Any]:
        return NO_META  # a later round's: the upstream call it answers was sent with the first's

    def progress_relay(self) -> ProgressFnT | None:
        if self.progress_token is None:
            return None

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            await self._reply.send(
                Progress(id=self._reply.nonce, progress=progress, total=total, message=message)
            )

        return relay

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        await self._reply.send(Log(id=self._reply.nonce, upstream=upstream, params=params))

    async def elicitation_complete(
        self, upstream: str, params: types.ElicitCompleteNotificationParams, *, during_call: bool
    ) -> None:
        return  # a held call's client is modern (as in held_calls.HeldCaller)

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


def _asked(nonce: str, replica: str, elsewhere: Elsewhere, caller: Caller, carrier: dict[str, str]) -> Asked:
    """The round as sent to its holder: the retry's answers and what the round's request is."""
    return Asked(
        id=nonce,
        sender=replica,
        token=elsewhere.token,
        tool=elsewhere.tool,
        client=caller.client.label if caller.client is not None else "",
        session=caller.session_id,
        answers=caller.input_responses or {},
        capabilities=caller.capabilities,
        log_level=caller.log_level,
        progress=caller.progress_token is not None,
        trace=carrier,
    )


async def _pass_on(message: Said, caller: Caller) -> None:
    """What the holder said during the round, to the client's request."""
    if isinstance(message, Progress):
        if (relay := caller.progress_relay()) is not None:
            await relay(message.progress, message.total, message.message)
    elif isinstance(message, Log):
        await caller.log(message.upstream, message.params)


def _outcome_of(outcome: Outcome | Failed | None, tool: str) -> ToolResult:
    """The round's result, or its error raised (none came: the round was not served)."""
    if isinstance(outcome, Outcome):
        return outcome.result
    if isinstance(outcome, Failed):
        raise ReplicaError(outcome.code, outcome.message)
    raise UnknownRound(tool)
