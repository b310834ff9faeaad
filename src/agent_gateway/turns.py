"""A client's large requests served one at a time.

The event loop serves everyone, one step at a time, and a request's body costs its steps
time in proportion to its size: a 3.5 MB ``tools/call`` is ~20 ms of parsing, checking and
digesting with no await in between. Sixteen of them at once from one client put sixteen such
steps ahead of every other client's each turn of the loop: a bystander's call took 250 ms
at its median and 420 ms at p99 against 6 ms before (``bench/README.md``). A client's
requests whose bodies pass ``LARGE_BODY_BYTES`` therefore take turns, first come first
served: at most one of them is past admission at once, so another client waits at most one
such step per turn. They wait with their bodies read, and those are counted against the
client's share of the bytes in flight (``in_flight.BodyHeld``), which bounds how many can
wait. Smaller requests, and every other client, never wait here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from agent_gateway.access import Principal
from agent_gateway.tally import Tally

logger = logging.getLogger(__name__)

LARGE_BODY_BYTES = 256 * 1024
"""Past this a body costs its request's step ~1.5 ms or more of the loop (~6 ns a byte)."""

large_waits = Tally(
    "agent_gateway.requests.waited",
    "Requests with bodies past 256 KiB that waited for their client's previous such request "
    "to be served (a client's large requests are served one at a time).",
)


@asynccontextmanager
async def large_turn(client: Principal, body_bytes: int) -> AsyncIterator[None]:
    """``client``'s turn to be served a request of ``body_bytes``: at once for a small one,
    after its previous large one for a large one."""
    if body_bytes <= LARGE_BODY_BYTES:
        yield
        return
    if client.turn is None:
        client.turn = anyio.Lock()
    if client.turn.locked():
        large_waits.add(1, {})
        logger.debug("a large request of %s waits for its previous one", client.label)
    async with client.turn:
        yield
