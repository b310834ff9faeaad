"""What stands between callers and one upstream: its circuit breaker and its concurrency cap.

One ``Guard`` per upstream, shared by its shared session and every dedicated one, so the
upstream's health is judged from all of its traffic.

The breaker counts *consecutive* calls that failed for the upstream's sake (connection lost,
no answer in time). A JSON-RPC error or an ``isError`` result is an answer, so it counts as
a success: the upstream is alive. A call that timed out is not counted when the upstream
answered another call while it waited: a tool that is slow for its arguments is not the
upstream failing, and one client's slow calls must not open the circuit for every client. Nor is it counted while health checks run: the next one is sent at
once instead, and only its failure (which drops the connection) says the upstream is gone.
Without health checks, a timeout with nothing heard is counted. A client's dedicated session
given up (``dedicated.py``: it stopped answering its own health check) fails its calls, which
are not counted either while health checks run or another call is answered: one client's
session is not the upstream. A dedicated session that dies (its process exits) still counts, so
a server that dies on every call is cut off instead of restarted for ever. After ``breaker.failures``
failures in a row the circuit opens and
calls fail at once without being sent; after ``breaker.reset`` seconds one call at a time is
let through as a probe (half-open): its success closes the circuit, its failure re-opens it.

The cap (``max_concurrency``) is shared fairly between clients: a call of one client (an
``ask_agent`` run's calls are its client's) is refused when that client already holds its
share of the upstream's calls in flight (``max_concurrency_per_client``; by default as many as
it leaves free). Slow calls hold their slots for minutes, and first come, first served let one
client (or two) hold every slot while every other client's call was refused. Calls of the
gateway's own (no client) count against the cap alone. At the cap, a call (on a shared
session or a dedicated one) of a client with none in flight here waits for the next slot
(``queueing.py``), which is ``reserved`` for that call until it is admitted (``Kept``), and
each call's end is told to those turns (``freed``): a slot freed by a call that took no turn
there (the gateway's own) is given on too.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum

import anyio

from agent_gateway.config import BreakerConfig, UpstreamConfig
from agent_gateway.errors import (
    CircuitOpen,
    SessionGivenUp,
    UpstreamBusy,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from agent_gateway.logs import clipped
from agent_gateway.refusals import refused
from agent_gateway.telemetry import breaker_transitions

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class Circuit(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Closed → open after consecutive failures → half-open after ``reset`` → closed or open."""

    def __init__(self, upstream: str, config: BreakerConfig, clock: Clock = time.monotonic) -> None:
        self._upstream = upstream
        self._config = config
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self.last_failure: str | None = None

    @property
    def state(self) -> Circuit:
        if self._opened_at is None:
            return Circuit.CLOSED
        if self._clock() - self._opened_at >= self._config.reset:
            return Circuit.HALF_OPEN
        return Circuit.OPEN

    def admit(self) -> bool:
        """Let one call through; True when it is the half-open probe.

        Raises:
            CircuitOpen: the circuit is open, or half-open with its probe already in flight.
        """
        state = self.state
        if state is Circuit.CLOSED:
            return False
        if state is Circuit.HALF_OPEN and not self._probing:
            self._probing = True
            logger.info("upstream %s: circuit half-open, sending a probe call", self._upstream)
            return True
        raise self._refusal(state)

    def refuse_if_open(self) -> None:
        """Raises ``CircuitOpen`` while the circuit is open (before any work for a call that
        would be refused: a client's dedicated session, a process, is not opened for it)."""
        if (state := self.state) is Circuit.OPEN:
            raise self._refusal(state)

    def _refusal(self, state: Circuit) -> CircuitOpen:
        assert self._opened_at is not None
        wait = max(0.0, self._config.reset - (self._clock() - self._opened_at))
        return CircuitOpen(
            self._upstream,
            f"circuit open after {self._failures} failed calls (last: {self.last_failure}); "
            + (f"next probe in {wait:.0f}s" if state is Circuit.OPEN else "a probe call is in flight"),
        )

    def succeeded(self, probe: bool) -> None:
        if probe:
            self._probing = False
        if self._opened_at is not None and (probe or self.state is Circuit.HALF_OPEN):
            self._transition(Circuit.CLOSED)
            self._opened_at = None
        self._failures = 0

    def failed(self, probe: bool, reason: str) -> None:
        self.last_failure = reason
        self._failures += 1
        if probe:
            self._probing = False
            self._opened_at = self._clock()
            self._transition(Circuit.OPEN)
        elif self._opened_at is None and self._failures >= self._config.failures:
            self._opened_at = self._clock()
            self._transition(Circuit.OPEN)

    def released(self, probe: bool) -> None:
        """A call ended without telling anything about the upstream (it was cancelled)."""
        if probe:
            self._probing = False

    def _transition(self, to: Circuit) -> None:
        breaker_transitions.add(1, {"agent_gateway.upstream": self._upstream, "state": str(to)})
        if to is Circuit.OPEN:
            logger.warning(
                "upstream %s: circuit open after %d failed calls (last: %s); probing in %gs",
                self._upstream,
                self._failures,
                self.last_failure,
                self._config.reset,
            )
        else:
            logger.info("upstream %s: circuit closed", self._upstream)


class Kept:
    """A slot kept at ``guard`` for one call given its turn (``queueing.py``): taken as that
    call is admitted (the turn's context carries it: ``KEPT``, copied into a task the call starts
    within it, as a held call's upstream call), else given back as its turn ends."""

    __slots__ = ("client", "done", "guard")

    def __init__(self, guard: Guard, client: str) -> None:
        self.guard, self.client, self.done = guard, client, False


KEPT: ContextVar[Kept | None] = ContextVar("agent_gateway.kept_slot", default=None)
"""The slot kept for the call whose turn this context is in, if it waited for one."""


class Guard:
    """The breaker and the concurrency cap of one upstream, applied around each call."""

    def __init__(self, upstream: str, config: UpstreamConfig, clock: Clock = time.monotonic) -> None:
        self.upstream = upstream
        self.breaker = CircuitBreaker(upstream, config.breaker, clock) if config.breaker else None
        self._clock = clock
        self._limit = config.max_concurrency
        self._share = config.max_concurrency_per_client
        self.in_flight = 0
        self.held: dict[str, int] = {}
        """Calls in flight per client label: only clients with one at least (at most
        ``max_concurrency`` entries, whatever the number of clients)."""
        self.reserved = 0
        """Slots given to calls that waited for them in the upstream's turns (``queueing.py``)
        and not yet admitted: not free for any other call meanwhile."""
        self.reserved_for: dict[str, int] = {}
        """Those slots per client label (``Kept``)."""
        self.freed: Callable[[], None] | None = None
        """Told as each call ends (the upstream's turns: the next waiting call's)."""
        self.heard_at = -math.inf
        """When the upstream last answered a call."""
        self.checked = False
        """Health checks run on the upstream (they, not timeouts, tell that it is gone)."""
        self._asked: anyio.Event | None = None
        self.unimplemented: set[str] = set()
        """Optional methods the upstream answered with Method not found: never sent again."""

    @property
    def limit(self) -> int | None:
        """Its ``max_concurrency`` (None: none)."""
        return self._limit

    @property
    def circuit(self) -> Circuit:
        return self.breaker.state if self.breaker is not None else Circuit.CLOSED

    @contextmanager
    def admitted(self, client: str | None = None) -> Iterator[None]:
        """One call (of ``client``, a client's label; None: the gateway's own): refused at
        once when the circuit is open, the cap is reached or ``client`` holds its share of it;
        its outcome is recorded on the breaker.

        Raises:
            CircuitOpen, UpstreamBusy: the call was not sent.
        """
        if (
            self.reserved
            and (kept := KEPT.get()) is not None
            and kept.guard is self
            and kept.client == client
        ):
            self.give_back(kept)  # the slot kept for this call: its own now
        if self._limit is not None and self.in_flight + self.reserved >= self._limit:
            raise UpstreamBusy(
                self.upstream,
                f"{self.in_flight + self.reserved} calls in flight, the limit (max_concurrency) is {self._limit}",
            )
        if client is not None:
            self._refuse_over_share(client)
        probe = self.breaker.admit() if self.breaker is not None else False
        sent = self._clock()
        self.in_flight += 1
        if client is not None:
            self.held[client] = self.held.get(client, 0) + 1
        try:
            yield
        except UpstreamTimeout as exc:
            if self.breaker is not None:
                self._timed_out(self.breaker, probe, sent, exc.cause)
            raise
        except SessionGivenUp as exc:
            if self.breaker is not None:
                self._given_up(self.breaker, probe, sent, exc.cause)
            raise
        except UpstreamUnavailable as exc:
            if self.breaker is not None:
                self.breaker.failed(probe, exc.cause)
            raise
        except UpstreamRejected:
            self.heard()  # an error answer is still an answer: it is alive
            if self.breaker is not None:
                self.breaker.succeeded(probe)
            raise
        except BaseException:
            if self.breaker is not None:  # cancelled: no verdict either way
                self.breaker.released(probe)
            raise
        else:
            self.heard()
            if self.breaker is not None:
                self.breaker.succeeded(probe)
        finally:
            self.in_flight -= 1
            if client is not None:
                self._release(client)
            if self.freed is not None:
                self.freed()

    def room(self) -> bool:
        """A slot is free: none held by a call in flight or kept for one given its turn."""
        return self._limit is None or self.in_flight + self.reserved < self._limit

    def holds(self, client: str) -> bool:
        """``client`` has calls in flight here, or a slot kept for one."""
        return client in self.held or client in self.reserved_for

    def keep(self, client: str) -> Kept:
        """Keep a slot for one of ``client``'s calls, given its turn."""
        self.reserved += 1
        self.reserved_for[client] = self.reserved_for.get(client, 0) + 1
        return Kept(self, client)

    def give_back(self, kept: Kept) -> None:
        """The kept slot is taken by its call, or free again (once: later calls do nothing)."""
        if kept.done:
            return
        kept.done = True
        self.reserved -= 1
        if (left := self.reserved_for[kept.client] - 1) > 0:
            self.reserved_for[kept.client] = left
        else:
            del self.reserved_for[kept.client]

    def _refuse_over_share(self, client: str) -> None:
        """Raises ``UpstreamBusy`` when ``client`` holds its share of the cap: a fixed
        ``max_concurrency_per_client``, or else as many calls as the upstream has slots free
        (one client alone takes half the slots, a second half the rest, …: the slots are
        never all taken by the few, and a client with fewer calls in flight finds one)."""
        held = self.held.get(client, 0)
        if self._share is not None:
            if held < self._share:
                return
            bound = f"its share (max_concurrency_per_client) is {self._share}"
        elif self._limit is None or held < (free := self._limit - self.in_flight - self.reserved):
            return
        else:
            bound = (
                f"and {free} of the upstream's {self._limit} (max_concurrency) are free: "
                "a client's share is as many as it leaves free"
            )
        raise over_share(self.upstream, client, ("calls", held, "in flight"), bound)

    def _release(self, client: str) -> None:
        left = self.held[client] - 1
        if left:
            self.held[client] = left
        else:  # gone at 0: the dict holds only clients with calls in flight
            del self.held[client]

    def heard(self) -> None:
        """The upstream answered something: it is alive."""
        self.heard_at = self._clock()

    async def check_due(self, interval: float) -> None:
        """Wait for the next health check: ``interval``, or less if a call times out."""
        self._asked = anyio.Event()
        with anyio.move_on_after(interval):
            await self._asked.wait()
        self._asked = None

    def _timed_out(self, breaker: CircuitBreaker, probe: bool, sent: float, detail: str) -> None:
        if self.heard_at > sent:
            logger.debug("upstream %s: %s; not counted: it answered meanwhile", self.upstream, detail)
            breaker.released(probe)
        elif self.checked:
            logger.debug("upstream %s: %s; a health check is sent now to tell", self.upstream, detail)
            breaker.released(probe)
            self.check_soon()
        else:
            breaker.failed(probe, detail)

    def _given_up(self, breaker: CircuitBreaker, probe: bool, sent: float, detail: str) -> None:
        if self.checked or self.heard_at > sent:
            logger.debug("upstream %s: %s; one client's session, not counted", self.upstream, detail)
            breaker.released(probe)
            self.check_soon()
        else:
            breaker.failed(probe, detail)

    def check_soon(self) -> None:
        """Send the next health check now (when health checks run): something went wrong
        that only the upstream's answer to it can tell apart from the upstream gone."""
        if self._asked is not None:
            self._asked.set()


def over_share(upstream: str, client: str, held: tuple[str, int, str], bound: str) -> UpstreamBusy:
    """A call of ``client`` refused for its share of ``upstream``'s slots or places to wait
    (``held``: what of them, how many it holds, doing what; ``bound``: its share), counted and
    logged: the error to raise."""
    what, count, doing = held
    refused(
        "upstream_share",
        "client %s holds its share of upstream %s's %s: %d %s there, %s",
        client, upstream, what, count, doing, bound, peer=client,
    )  # fmt: skip
    return UpstreamBusy(
        upstream,
        f"client {clipped(client)!r} has {count} calls {doing} here, {bound}. Its share is full, "
        "not the upstream (other clients' calls are served); retry once some of its calls end",
    )
