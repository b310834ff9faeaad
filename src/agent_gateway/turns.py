"""A client's requests taking turns: a few worked on at once, its large ones one at a time.

The event loop serves everyone, one step at a time, first come first served. A client with
64 requests in the gateway puts 64 steps ahead of every other client's each turn of the loop:
one client's pings on 64 connections, with no rate limit set, made a bystander's calls 10x
slower (``bench/README.md``). So a client takes turns:

- working: ``WORKING`` of its requests worked on at once, from its session checks to its
  answer, less the time each waits on an upstream or a model (``away``: its client's next
  request is worked on meanwhile, and the one waiting takes a turn again for its answer);
- parsing, for a body past ``LARGE_BODY_BYTES`` (a 3.5 MB ``tools/call`` is ~20 ms of
  parsing, checking and digesting with no await in between): one at a time;
- serving, for such a request: one at a time, throughout.

A request without a body (a GET or a DELETE, on any path: a 404 too) takes a working turn: it
is worked on whole in one step, as a ping is. A listen stream, or a GET of the MCP path (a
notification stream), which last for hours, take none. A request without the credential a
gateway with auth requires takes a working turn of its address's (``Strangers``) once its body
is drained. An answer to the gateway's question (sampling, elicitation, roots) or a
notification takes a working turn, never a serving one: it may be what the large request being
served waits for (the one asking is away meanwhile). A request waits ``TURN_WAIT`` at most,
then is served anyway; one its client cancels meanwhile (a handshake-era
``notifications/cancelled`` naming it) is never served.

Waiting, their bodies are read, and counted against the client's share of the bytes in
flight (``in_flight.BodyHeld``), which bounds how many can wait. Every other client's
requests never wait for this client's turns."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import anyio
import anyio.lowlevel

from agent_gateway.addresses import client_key
from agent_gateway.tally import Tally

logger = logging.getLogger(__name__)

LARGE_BODY_BYTES = 256 * 1024
"""Past this a body costs its request's step ~1.5 ms or more of the loop (~6 ns a byte)."""
TURN_WAIT = 5.0
"""Seconds a large request waits for its serving turn, then is served anyway: one of minutes
(a slow upstream's call, an agent run) holds its turn throughout, and holds up its client's
next large request this long at most (16 calls of 3.5 MB take ~1 s of turns)."""
WORKING = 4
"""A client's requests the gateway works on at once, first come first served: each of its
others waits (``TURN_WAIT`` at most) for one of them to be answered or to wait elsewhere."""
STRANGERS = 10_000
"""Addresses whose unauthenticated requests' turns are kept; past it, those with none in the
gateway are forgotten."""
_LASTING = ("subscriptions/listen",)
"""Requests whose serving lasts as long as their client wants: they take no turn."""

turn_waits = Tally(
    "agent_gateway.requests.waited",
    "Requests that waited for their client's others, by turn: working (four of a client's "
    "worked on at once), parsing (bodies past 256 KiB, one at a time), serving (requests with "
    "such bodies, one at a time, from their session checks to their answer), given_up (a "
    "request its client cancelled while it waited to be served: never served).",
)
_CANCELLED = b"notifications/cancelled"


Waiting = tuple[str, str | int]
"""A request waiting for its serving turn: its session and its id."""


@dataclass(eq=False)
class Turns:
    """One client's turns (kept on its ``Principal``)."""

    parsing: anyio.Lock = field(default_factory=anyio.Lock)
    serving: anyio.Lock = field(default_factory=anyio.Lock)
    working: anyio.Semaphore = field(default_factory=lambda: anyio.Semaphore(WORKING))
    waiting: dict[Waiting, anyio.CancelScope] = field(default_factory=dict[Waiting, anyio.CancelScope])
    """Its handshake-era requests waiting for their serving turn, which a cancel gives up."""

    @property
    def busy(self) -> bool:
        """Whether a request holds or waits for one of these turns."""
        return self.working.value < WORKING or self.serving.locked() or self.parsing.locked()

    def cancelled(self, session: str, body: bytes) -> None:
        """Give up the waiting request that ``body`` cancels, if it is a cancel naming one.
        Parsed again, only while the client has a request waiting and only when small: the
        SDK's transport is where a notification is read, this is the one it cannot see. A body
        with an escape is parsed too: ``notifications\\/cancelled`` is the same method."""
        if not self.waiting or len(body) > LARGE_BODY_BYTES or (_CANCELLED not in body and b"\\" not in body):
            return
        try:
            message = json.loads(body)
            params = message["params"]
            key = (session, params["requestId"]) if message["method"] == "notifications/cancelled" else None
        except (ValueError, TypeError, KeyError, RecursionError):
            return
        if key is not None and _an_id(key[1]) and (scope := self.waiting.get(key)) is not None:
            scope.cancel()


def parsing_turn(turns: Turns, label: str, body_bytes: int) -> AbstractAsyncContextManager[None]:
    """The client's turn to parse a body of ``body_bytes`` (at once for a small one: the
    common request pays for no context of its own)."""
    return _AT_ONCE if body_bytes <= LARGE_BODY_BYTES else _parsing(turns.parsing, label)


def serving_turn(
    turns: Turns, label: str, body: bytes, request: Mapping[str, Any] | None, session: str | None
) -> AbstractAsyncContextManager[bool]:
    """The client's turns to serve ``request``: its working turn, and its serving turn too for
    a large body. Entered with whether to serve it (False: its client cancelled it while it
    waited). A request waits ``TURN_WAIT`` at most, then is served anyway. ``request`` None:
    a notification or an answer, which takes a working turn too (the SDK answers its POST 202
    at once and only then hands it to the session, in the same task: a client's notifications
    on 64 connections piled up unbounded behind its session, +600 MB in 10 s), and may cancel
    a request waiting for its turns."""
    if request is None:
        if session is not None:
            turns.cancelled(session, body)  # and passed on: the SDK's session reads it too
        return Working(turns, label, None, large=False)
    # _LASTING is a tuple: a method is compared, not hashed (it may be a list).
    if request.get("method") in _LASTING:
        return _SERVE
    request_id = request.get("id")
    key = (session, request_id) if session is not None and _an_id(request_id) else None
    return Working(turns, label, key, large=len(body) > LARGE_BODY_BYTES)


def bodiless_turn(turns: Turns, label: str) -> AbstractAsyncContextManager[bool]:
    """The client's working turn for a request without a body (not a stream's: it takes none).
    One client's 404s or ``/healthz`` on 64 connections were each worked on in the step that
    read it, 64 ahead of every other client's each turn of the loop: a bystander 2-3x slower."""
    return Working(turns, label, None, large=False)


class Strangers:
    """The working turns of requests without the credential a gateway with auth requires (each
    answered 401), by address. They took none: one address's 401s on 64 connections were each
    worked on in the step that read it, and a bystander with a token waited 4x as long, as for
    404s before they took turns. Kept apart from clients' turns: they name no client (and a
    token's subject may be any string, an address's label too)."""

    def __init__(self) -> None:
        self._turns: dict[str, Turns] = {}

    def turn(self, address: str | None) -> AbstractAsyncContextManager[bool]:
        """The working turn of a request from ``address`` (an IPv6 one's /64)."""
        key = client_key(address) if address is not None else "an unknown address"
        if (turns := self._turns.get(key)) is None:
            if len(self._turns) >= STRANGERS:
                self._turns = {known: kept for known, kept in self._turns.items() if kept.busy}
            turns = self._turns[key] = Turns()
        return bodiless_turn(turns, f"an unauthenticated client at {key}")  # a 401's, as a 404's

    def __len__(self) -> int:
        return len(self._turns)

    def __contains__(self, key: str) -> bool:
        return key in self._turns


def away() -> AbstractAsyncContextManager[None]:
    """Inside, the request this task serves lets its client's working turn go: it waits on an
    upstream or a model, no work of the gateway's, and its client's other requests are worked
    on meanwhile. Taken again after (``TURN_WAIT`` at most). The turn is the task's, as a
    cancel scope is: where no request holds one (stdio, the gateway's own calls), nothing."""
    working = _WORKING.get()
    if working is None or not working.held or working.task is not asyncio.current_task():
        return _AT_ONCE  # a task the request started shares its context, not its turn
    return _Away(working)


def _an_id(value: object) -> TypeGuard[str | int]:
    return isinstance(value, str | int) and not isinstance(value, bool)


_AT_ONCE: AbstractAsyncContextManager[None] = nullcontext()
_SERVE: AbstractAsyncContextManager[bool] = nullcontext(True)


@asynccontextmanager
async def _parsing(lock: anyio.Lock, label: str) -> AsyncIterator[None]:
    if lock.locked():
        turn_waits.add(1, {"turn": "parsing"})
        logger.debug("a large body of %s waits for its parsing turn", label)
    async with lock:
        yield


class Working:
    """One request's turns: its client's working turn, and its serving turn if large. A class,
    not a generator: every request enters one, and at once when its client has turns free."""

    __slots__ = ("_key", "_label", "_large", "_reset", "_turns", "held", "large_held", "task")

    def __init__(self, turns: Turns, label: str, key: Waiting | None, large: bool) -> None:
        self._turns, self._label, self._key, self._large = turns, label, key, large
        self.held = self.large_held = False
        self._reset: Token[Working | None] | None = None
        self.task: asyncio.Task[Any] | None = None
        """The task serving the request: the only one ``away`` lets the turn go for."""

    async def __aenter__(self) -> bool:
        working = self._turns.working
        if not self._large and working.value > 0:  # free: no wait, no scope
            working.acquire_nowait()
            self.held = True
            await self._step_holding()
        elif not await self._waited():
            return False
        self.task = asyncio.current_task()
        self._reset = _WORKING.set(self)
        return True

    async def _step_holding(self) -> None:
        """A step of its own, holding the turn: a request that needs no await (a ping, a
        listing) is otherwise worked on whole in the step that read it, one for each of its
        client's connections at each turn of the loop, and no two of them would ever be in the
        gateway at once for the next to wait for a turn. Taken by every request: taken only
        when another of its client's came in the same turn of the loop, or was in the gateway,
        it engaged in some runs of the flood test and not in others."""
        try:
            await anyio.lowlevel.checkpoint()
        except BaseException:  # cancelled: not entered, so never left
            self.let_go()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        if self._reset is not None:
            _WORKING.reset(self._reset)
        if self.held:
            self._turns.working.release()
        if self.large_held:
            self._turns.serving.release()
        self.held = self.large_held = False

    async def _waited(self) -> bool:
        """Waits for the turns, ``TURN_WAIT`` at most; False: its client cancelled it."""
        turns, key = self._turns, self._key
        _counted_wait(turns, self._large, self._label)
        with anyio.move_on_after(TURN_WAIT), anyio.CancelScope() as waiting:
            if key is not None:
                turns.waiting[key] = waiting
            try:
                if self._large:
                    await turns.serving.acquire()
                    self.large_held = True
                await turns.working.acquire()
                self.held = True
            except BaseException:  # cancelled: not entered, so never left
                if self.large_held:
                    turns.serving.release()
                    self.large_held = False
                raise
            finally:
                if key is not None and turns.waiting.get(key) is waiting:
                    del turns.waiting[key]
        if given_up := not self.held and waiting.cancel_called:
            turn_waits.add(1, {"turn": "given_up"})
            logger.info("a request of %s was cancelled by its client while it waited its turn", self._label)
        return not given_up

    def let_go(self) -> None:
        """The working turn let go while the request waits elsewhere (``away``)."""
        self.held = False
        self._turns.working.release()

    async def take_again(self) -> None:
        """The working turn taken again after ``away``, ``TURN_WAIT`` at most."""
        working = self._turns.working
        if working.value > 0:
            working.acquire_nowait()
            self.held = True
            return
        turn_waits.add(1, {"turn": "working"})
        with anyio.move_on_after(TURN_WAIT):
            await working.acquire()
            self.held = True


def _counted_wait(turns: Turns, large: bool, label: str) -> None:
    if large and turns.serving.locked():
        turn_waits.add(1, {"turn": "serving"})
        logger.debug("a large request of %s waits for its serving turn", label)
    elif turns.working.value == 0:
        turn_waits.add(1, {"turn": "working"})
        logger.debug("a request of %s waits for its working turn", label)


class _Away:
    __slots__ = ("_working",)

    def __init__(self, working: Working) -> None:
        self._working = working

    async def __aenter__(self) -> None:
        self._working.let_go()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._working.take_again()


_WORKING: ContextVar[Working | None] = ContextVar("agent_gateway_working", default=None)
"""The request this task serves, holding its client's working turn (``away``)."""
