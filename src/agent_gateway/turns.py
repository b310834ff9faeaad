"""A client's large requests served one at a time.

The event loop serves everyone, one step at a time, and a request's body costs its steps
time in proportion to its size: a 3.5 MB ``tools/call`` is ~20 ms of parsing, checking and
digesting with no await in between. Sixteen of them at once from one client put sixteen such
steps ahead of every other client's each turn of the loop: a bystander's call took 330 ms
at its median and 480-620 ms at p99 against 6 ms before (``bench/README.md``). So a client
whose bodies pass ``LARGE_BODY_BYTES`` takes turns, first come first served, twice:

- parsing: one of its large bodies parsed at a time (a step that waits on nothing else);
- serving: one of its large requests served at a time, from its session checks to its
  answer. Only a request waits for this turn, and not a listen stream (which lasts for
  hours): an answer to the gateway's question (sampling, elicitation, roots) or a
  notification may be what the request being served waits for. A request waits
  ``TURN_WAIT`` at most, then is served anyway; one its client cancels meanwhile (a
  handshake-era ``notifications/cancelled`` naming it) is never served.

Waiting, their bodies are read, and counted against the client's share of the bytes in
flight (``in_flight.BodyHeld``), which bounds how many can wait. Smaller bodies, and every
other client, never wait here."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import anyio

from agent_gateway.tally import Tally

logger = logging.getLogger(__name__)

LARGE_BODY_BYTES = 256 * 1024
"""Past this a body costs its request's step ~1.5 ms or more of the loop (~6 ns a byte)."""
TURN_WAIT = 5.0
"""Seconds a large request waits for its serving turn, then is served anyway: one of minutes
(a slow upstream's call, an agent run) holds its turn throughout, and holds up its client's
next large request this long at most (16 calls of 3.5 MB take ~1 s of turns)."""
_LASTING = ("subscriptions/listen",)
"""Requests whose serving lasts as long as their client wants: they take no serving turn."""

large_waits = Tally(
    "agent_gateway.requests.waited",
    "Bodies past 256 KiB that waited for their client's previous one, by turn: parsing (one "
    "at a time), serving (one request at a time, from its session checks to its answer), "
    "given_up (a request its client cancelled while it waited to be served: never served).",
)
_CANCELLED = b"notifications/cancelled"


Waiting = tuple[str, str | int]
"""A request waiting for its serving turn: its session and its id."""


@dataclass(eq=False)
class Turns:
    """One client's turns (kept on its ``Principal``)."""

    parsing: anyio.Lock = field(default_factory=anyio.Lock)
    serving: anyio.Lock = field(default_factory=anyio.Lock)
    waiting: dict[Waiting, anyio.CancelScope] = field(default_factory=dict[Waiting, anyio.CancelScope])
    """Its handshake-era requests waiting for their serving turn, which a cancel gives up."""

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
    """The client's turn to serve ``request`` (None: not a request, which waits for none, and
    may cancel one waiting): entered with whether to serve it (False: its client cancelled it
    while it waited). A request waits ``TURN_WAIT`` at most, then is served anyway."""
    if request is None and session is not None:
        turns.cancelled(session, body)  # and passed on: the SDK's session reads it too
    # _LASTING is a tuple: a method is compared, not hashed (it may be a list).
    if request is None or request.get("method") in _LASTING or len(body) <= LARGE_BODY_BYTES:
        return _SERVE
    request_id = request.get("id")
    key = (session, request_id) if session is not None and _an_id(request_id) else None
    return _serving(turns, label, key)


def _an_id(value: object) -> TypeGuard[str | int]:
    return isinstance(value, str | int) and not isinstance(value, bool)


_AT_ONCE: AbstractAsyncContextManager[None] = nullcontext()
_SERVE: AbstractAsyncContextManager[bool] = nullcontext(True)


@asynccontextmanager
async def _parsing(lock: anyio.Lock, label: str) -> AsyncIterator[None]:
    if lock.locked():
        large_waits.add(1, {"turn": "parsing"})
        logger.debug("a large body of %s waits for its parsing turn", label)
    async with lock:
        yield


@asynccontextmanager
async def _serving(turns: Turns, label: str, key: Waiting | None) -> AsyncIterator[bool]:
    lock = turns.serving
    if lock.locked():
        large_waits.add(1, {"turn": "serving"})
        logger.debug("a large request of %s waits for its serving turn", label)
    taken = False
    with anyio.move_on_after(TURN_WAIT), anyio.CancelScope() as waiting:
        if key is not None:
            turns.waiting[key] = waiting
        try:
            await lock.acquire()
            taken = True
        finally:
            if key is not None and turns.waiting.get(key) is waiting:
                del turns.waiting[key]
    if given_up := not taken and waiting.cancel_called:
        large_waits.add(1, {"turn": "given_up"})
        logger.info("a large request of %s was cancelled by its client while it waited its turn", label)
    try:
        yield not given_up
    finally:
        if taken:
            lock.release()
