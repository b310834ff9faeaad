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
  ``TURN_WAIT`` at most, then is served anyway.

Waiting, their bodies are read, and counted against the client's share of the bytes in
flight (``in_flight.BodyHeld``), which bounds how many can wait. Smaller bodies, and every
other client, never wait here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

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
    "at a time), serving (one request at a time, from its session checks to its answer).",
)


@dataclass(eq=False)
class Turns:
    """One client's turns (kept on its ``Principal``)."""

    parsing: anyio.Lock = field(default_factory=anyio.Lock)
    serving: anyio.Lock = field(default_factory=anyio.Lock)


def parsing_turn(turns: Turns, label: str, body_bytes: int) -> AbstractAsyncContextManager[None]:
    """The client's turn to parse a body of ``body_bytes`` (at once for a small one: the
    common request pays for no context of its own)."""
    return _AT_ONCE if body_bytes <= LARGE_BODY_BYTES else _parsing(turns.parsing, label)


def serving_turn(
    turns: Turns, label: str, body_bytes: int, request: Mapping[str, Any] | None
) -> AbstractAsyncContextManager[None]:
    """The client's turn to serve ``request`` (None: not a request, which waits for none). A
    request waits ``TURN_WAIT`` at most, then is served anyway."""
    lasting = request is None or request.get("method") in _LASTING  # a tuple: compared, not hashed
    if lasting or body_bytes <= LARGE_BODY_BYTES:
        return _AT_ONCE
    return _serving(turns.serving, label)


_AT_ONCE: AbstractAsyncContextManager[None] = nullcontext()


@asynccontextmanager
async def _parsing(lock: anyio.Lock, label: str) -> AsyncIterator[None]:
    if lock.locked():
        large_waits.add(1, {"turn": "parsing"})
        logger.debug("a large body of %s waits for its parsing turn", label)
    async with lock:
        yield


@asynccontextmanager
async def _serving(lock: anyio.Lock, label: str) -> AsyncIterator[None]:
    if lock.locked():
        large_waits.add(1, {"turn": "serving"})
        logger.debug("a large request of %s waits for its serving turn", label)
    taken = False
    with anyio.move_on_after(TURN_WAIT):
        await lock.acquire()
        taken = True
    try:
        yield
    finally:
        if taken:
            lock.release()
