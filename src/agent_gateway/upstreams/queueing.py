"""Clients' calls to one upstream taking turns: at most ``window`` sent at once, the others
waiting in the gateway, served client by client. One queue per upstream, for its shared session
and its dedicated (``per_client``) ones alike.

An upstream works on the calls sent to it in the order they came, out of the gateway's sight:
one client's calls of a fast tool on 64 connections put 64 calls ahead of every other client's
there (``bench/README.md``). A ping waits in that queue as a call does. The gateway pings the
shared session as it connects (idle: the fastest answer), then every ``PROBE_INTERVAL`` while
``FLOOR`` calls or more are in flight (``server/discover`` in the modern era), each ping's time
taken less ``LAGS`` times how late the gateway's own loop woke a timer just before.

- Two pings in a row answered ``TARGET`` later than the fastest one (and in twice its time) say
  the upstream has calls queued. The window shrinks to the calls in flight times fastest plus
  target over the ping's time (Little's law), by half at most at each ping, ``FLOOR`` at least.
- A ping answered in time while the window held calls back widens it past the calls in flight,
  up to ``max_concurrency``: by one after a late ping, else twice as wide.

Calls that wait on I/O, and an upstream that works on many at once, leave its pings fast: the
window stays open whatever their tools' latency (it is not judged from the calls themselves,
whose tools differ a thousandfold). Once idle again (fewer than ``FLOOR`` in flight, none
waiting) the window is whole and the fastest ping measured anew; once the shared session is
lost (``reset``), the window is whole. It is judged only where the shared session's server is
the one the calls go to: not for a ``per_client`` stdio upstream, whose dedicated sessions are
processes of their own (their calls wait at the cap alone).

Calls past the window wait in one queue per client, the next one sent the next client's (round
robin). At most ``max_concurrency`` calls wait, a client's at most as many as it leaves free
and its ``max_concurrency_per_client`` (its share of the slots, ``guard.over_share``). A call
waits at most its timeout, then is refused as not sent (``UpstreamBusy``); once sent, its
timeout starts. When a session is lost or closed, the calls waiting to go to it go on at once,
to fail saying so (``gone``).

At the cap itself (the window whole, ``max_concurrency`` calls sent) a call of a client with
none in flight at the upstream waits for the next slot, sent for it before any other client's;
a call of a client holding some there, or with one waiting, is refused at once (else a few
greedy clients, each holding its share and sending again as a call ends, kept the upstream full
for every client arriving). The slots are the guard's, which calls that take no turn here hold
too (the gateway's own, a held call's after its first round): a call is sent only while one is
free there, a slot given to a waiting call is kept there for that call (``Kept``, carried by
its turn's context into a task it starts: a held call's, a loop pass after its turn) until it
is admitted or its turn ends, and a slot any call frees is given on (``Guard.freed``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
from opentelemetry import trace

from agent_gateway.errors import UpstreamBusy
from agent_gateway.tally import Tally
from agent_gateway.upstreams.guard import KEPT, Guard, Kept, over_share

logger = logging.getLogger(__name__)

FLOOR = 4
"""The smallest window, and the calls in flight from which the upstream is pinged."""
TARGET = 0.005
"""Seconds a ping may wait at the upstream (past the fastest ping) before calls are held back."""
PROBE_INTERVAL = 0.1
"""Seconds between pings while busy: ten light requests a second, and only then."""
LAGS = 3
"""The gateway's loop passes a ping's time takes beyond the upstream's: it is written, its
answer read, its waiter woken (each pass as slow as the gateway is busy)."""
NO_CEILING = 100_000
"""The window of an upstream without ``max_concurrency`` (its largest allowed value)."""
_TOLD_EVERY = 60.0
"""Seconds between the info lines saying an upstream's calls are held back (debug between)."""

calls_waited = Tally(
    "agent_gateway.upstream.calls.waited",
    "Clients' calls that waited for their turn to be sent to an upstream, by upstream and why: "
    "window (its pings said it had calls queued) or full (max_concurrency calls in flight there).",
)


class Turn:
    """One call's turn (``CallQueue.turn``): a class, not a generator, as it is on every call."""

    __slots__ = ("_client", "_kept", "_queue", "_session", "_set", "_wait")

    def __init__(self, queue: CallQueue, client: str, wait: Callable[[], float], session: Session) -> None:
        self._queue, self._client, self._wait, self._session = queue, client, wait, session
        self._kept: Kept | None = None

    async def __aenter__(self) -> None:
        self._kept = await self._queue._taken(self._client, self._wait, self._session)
        if self._kept is not None:  # for the guard, as this call (or a task it starts) is admitted
            self._set = KEPT.set(self._kept)

    async def __aexit__(self, *exc: object) -> None:
        if (kept := self._kept) is not None:
            KEPT.reset(self._set)
            kept.guard.give_back(kept)  # not taken: it never reached the guard
        self._queue.sent -= 1
        self._queue._send_next()


class CallQueue:
    """The turns of the clients calling one upstream, on any of its sessions (its ``queue``)."""

    def __init__(
        self,
        upstream: str,
        limit: int | None,
        share: int | None = None,
        guard: Guard | None = None,
    ) -> None:
        """``limit``: its ``max_concurrency``; ``share``: its ``max_concurrency_per_client``;
        ``guard``: the upstream's (shared with the calls that take no turn here), whose count
        of calls in flight, all of them and each client's, the turns go by."""
        self.upstream = upstream
        self._ceiling = limit or NO_CEILING
        self._share = share
        self._guard = guard
        if guard is not None:  # a slot freed by a call that took no turn here is given on too
            guard.freed = self._send_next
        self.window = self._ceiling
        self.sent = 0
        """Calls sent and not yet answered."""
        self._given: dict[anyio.Event, Kept] = {}
        """The slot kept at the guard for each call given its turn that has not run yet."""
        self._waiting: dict[str, deque[_Waiting]] = {}
        """Each client's calls waiting, in the order of its turns (a client's key moves last
        as one of its calls is sent)."""
        self.fastest = math.inf
        """The shared session's fastest ping (seconds): what a ping takes with nothing queued."""
        self._busy = anyio.Event()
        self._late = False
        """The last ping was late."""
        self._told = {True: -math.inf, False: -math.inf}
        """When each of the two info lines (held back, sent as they come) was last logged."""

    @property
    def waiting(self) -> int:
        """Calls waiting for their turn."""
        return sum(len(calls) for calls in self._waiting.values())

    @property
    def held_back(self) -> int | None:
        """The window while it holds calls back (narrower than ``max_concurrency``), else None."""
        return self.window if self.window < self._ceiling else None

    def turn(self, client: str, wait: Callable[[], float], session: Session) -> Turn:
        """``client``'s call to ``session`` sent in its turn (waiting ``wait()`` seconds at
        most) and counted in flight until it ends: ``async with queue.turn(...)``.

        Raises:
            UpstreamBusy: no turn within its wait; the call was not sent.
        """
        return Turn(self, client, wait, session)

    async def _taken(self, client: str, wait: Callable[[], float], session: Session) -> Kept | None:
        """The slot kept for the call at the guard, when it waited for its turn."""
        if self.sent < self.window and not self._waiting and self._free():
            self.sent += 1
            if self.sent >= FLOOR:
                self._busy.set()
        elif session.lost.is_set() or session.client is None:  # on to fail there, saying why
            self.sent += 1
        elif self.window >= self._ceiling and self._holds(client):
            # Refused here, saying why: the guard would refuse it too (every slot is held or
            # kept for a call given its turn), as a full upstream only.
            raise UpstreamBusy(
                self.upstream,
                f"{self._in_flight()} calls in flight, the limit (max_concurrency) is {self._ceiling}; "
                "a client with calls in flight or waiting here is refused, one with none waits "
                "for the next slot",
            )
        else:
            return await self._wait(client, wait(), session)
        return None

    def _in_flight(self) -> int:
        """Calls holding the upstream's slots: the guard's, with those given theirs here."""
        guard = self._guard
        return self.sent if guard is None else guard.in_flight + guard.reserved

    def _free(self) -> bool:
        """A slot is free at the guard: calls that take no turn here (the gateway's own, a
        held call's after its first round) hold some of them."""
        return self._guard is None or self._guard.room()

    def _holds(self, client: str) -> bool:
        """``client`` has calls in flight at the upstream, waiting here, or given their turn."""
        return client in self._waiting or (self._guard is not None and self._guard.holds(client))

    async def _wait(self, client: str, wait: float, session: Session) -> Kept | None:
        self._refuse_over_share(client)
        full = self.window >= self._ceiling
        calls_waited.add(1, {"agent_gateway.upstream": self.upstream, "why": "full" if full else "window"})
        if full:
            logger.debug(
                "upstream %s is full: a call of client %s waits for the next slot", self.upstream, client
            )
        waiting = _Waiting(sent := anyio.Event(), session)
        self._waiting.setdefault(client, deque()).append(waiting)
        started = time.perf_counter()
        session.waiting += 1
        try:
            with anyio.move_on_after(wait):
                await sent.wait()
        except BaseException:
            self._left(client, waiting)
            raise
        finally:
            session.waiting -= 1
            session.used = time.monotonic()
        if not sent.is_set():
            self._left(client, waiting)
            raise UpstreamBusy(self.upstream, f"not sent within {wait:g}s: " + self._why_held())
        waited = (time.perf_counter() - started) * 1e3
        trace.get_current_span().set_attribute("agent_gateway.upstream.waited_ms", round(waited, 1))
        return self._given.pop(sent, None)  # none for a call its session's loss sent on

    def _why_held(self) -> str:
        """Why calls wait now: every slot taken, or the window narrowed."""
        if self.window >= self._ceiling:
            return f"every one of the upstream's {self._ceiling} slots (its max_concurrency) stayed taken; retry later"
        return (
            f"the upstream is answering slowly, so at most {self.window} calls are sent to it "
            "at once and clients take turns; retry later"
        )

    def _refuse_over_share(self, client: str) -> None:
        """Raises ``UpstreamBusy`` when ``max_concurrency`` calls wait, or ``client`` holds its
        share of the places: as many as it leaves free, and ``max_concurrency_per_client`` at
        most, as its share of the upstream's slots (``guard.py``: a call past it would wait
        only to be refused there)."""
        free = self._ceiling - self.waiting
        if free <= 0:
            raise UpstreamBusy(
                self.upstream,
                f"{self._ceiling} calls are waiting for their turn already (its max_concurrency): "
                + self._why_held(),
            )
        bound = free if self._share is None else min(free, self._share)
        if (held := len(self._waiting.get(client, ()))) < bound:
            return
        fixed = f", {self._share} at most (max_concurrency_per_client)" if self._share is not None else ""
        share = (
            f"and {free} of the {self._ceiling} places to wait (max_concurrency) are free: "
            f"a client's share is as many as it leaves free{fixed}"
        )
        raise over_share(self.upstream, client, ("places to wait", held, "waiting for their turn"), share)

    def _left(self, client: str, waiting: _Waiting) -> None:
        """A waiting call gone (cancelled, or out of time): a turn it was given goes on."""
        if (sent := waiting.sent).is_set():
            self.sent -= 1
            if (kept := self._given.pop(sent, None)) is not None:
                kept.guard.give_back(kept)
            self._send_next()
            return
        calls = self._waiting[client]
        calls.remove(waiting)
        if not calls:
            del self._waiting[client]

    def gone(self, session: Session) -> None:
        """``session`` is lost or closed: each call waiting to go to it is sent on at once (to
        fail there, saying so), as is one that took it just before (``_taken``); the calls
        waiting for the upstream's other sessions wait on."""
        for client, calls in list(self._waiting.items()):
            for waiting in [w for w in calls if w.session is session]:
                calls.remove(waiting)
                waiting.sent.set()
                self.sent += 1
            if not calls:
                del self._waiting[client]

    def reset(self) -> None:
        """The shared session, whose pings judge the window, is lost: the whole window again.
        The fastest ping is kept: the next session's first ping may meet its dedicated
        sessions' calls, and would be no measure of an idle upstream (``_idle`` measures it
        anew)."""
        self._late = False
        self._resize(self._ceiling, 0.0)
        self._send_next()

    def _send_next(self) -> None:
        while self._waiting and self.sent < self.window and self._free():
            client = next(iter(self._waiting))
            calls = self._waiting.pop(client)
            sent = calls.popleft().sent
            sent.set()
            self.sent += 1
            if self._guard is not None:  # its slot, until the call is admitted or its turn ends
                self._given[sent] = self._guard.keep(client)
            if calls:  # its next call goes behind every other client's
                self._waiting[client] = calls

    async def watch(self, ping: Callable[[], Awaitable[str | None]]) -> None:
        """Ping the upstream once at once (idle: its fastest answer), then while it is busy,
        and set the window from how long each ping took (run for the session's life). ``ping``
        says why it went unanswered, if it did: such a ping tells nothing of the upstream's
        queue (its health checks judge it) and is not counted."""
        if (took := await _timed(ping)) is not None:
            self.observed(took, 0.0)
        while True:
            await self._busy.wait()
            slept = anyio.current_time()
            await anyio.sleep(PROBE_INTERVAL)
            behind = anyio.current_time() - slept - PROBE_INTERVAL  # the gateway's own loop's lag
            if (took := await _timed(ping)) is not None:
                self.observed(took, behind)
            if self.sent < FLOOR and not self._waiting:
                await self._idle(ping)

    async def _idle(self, ping: Callable[[], Awaitable[str | None]]) -> None:
        """Not busy any more: the whole window again, and the fastest ping measured again while
        little is in flight (in place of the old one: a route that got slower for good would
        otherwise make every later ping look late)."""
        self._busy = anyio.Event()
        self._late = False
        self._resize(self._ceiling, 0.0)
        if (took := await _timed(ping)) is not None:
            self.fastest = took

    def observed(self, took: float, behind: float) -> None:
        """One ping's time (seconds), less ``LAGS`` times ``behind`` (how late the gateway's
        own loop woke a timer just before): the window narrowed when the ping waited at the
        upstream, widened when it did not while the window held calls back."""
        self.fastest = min(self.fastest, took)  # as measured: a lag misjudged never lowers it
        took = max(took - LAGS * behind, 0.0)
        expected = self.fastest + TARGET
        late, self._late = self._late, took > expected and took > 2 * self.fastest
        if self._late:
            if late:  # twice in a row: not one moment's lag of the gateway's own loop
                shrunk = max(FLOOR, self.sent // 2, math.floor(self.sent * expected / took))
                self._resize(min(self.window, shrunk), took)
        elif self._waiting or self.sent >= self.window:  # after a late one, a step at a time
            edge = max(self.window, self.sent)  # calls sent before it narrowed are not taken back
            widened = edge + 1 if late else edge * 2
            self._resize(min(self._ceiling, widened), took)
        self._send_next()

    def _resize(self, window: int, took: float) -> None:
        if window == self.window:
            return
        held_back = window < self._ceiling
        if held_back == (self.window < self._ceiling):  # not from or to the whole ceiling
            logger.debug("upstream %s: window %d (ping %.1f ms)", self.upstream, window, took * 1e3)
        elif held_back:
            self._tell(
                held_back,
                "upstream %s: a ping took %.1f ms (the fastest %.1f): it has calls queued; at most "
                "%d of clients' calls are sent to it at once now, clients taking turns",
                self.upstream, took * 1e3, self.fastest * 1e3, window,
            )  # fmt: skip
        else:
            self._tell(held_back, "upstream %s: calls are sent to it as they come again", self.upstream)
        self.window = window

    def _tell(self, held_back: bool, message: str, *values: object) -> None:
        """At info once a minute at most each way (an upstream on the edge goes to and fro),
        else debug."""
        now = time.monotonic()
        level = logging.INFO if now - self._told[held_back] >= _TOLD_EVERY else logging.DEBUG
        if level == logging.INFO:
            self._told[held_back] = now
        logger.log(level, message, *values)


class Session(Protocol):
    """What the queue knows of the upstream session a call goes to (``UpstreamSession``): its
    calls waiting here and when one last stopped waiting (a dedicated session is in use till
    then, ``dedicated.py``; a held call is admitted a loop pass on), whether it is lost or
    closed (no client)."""

    waiting: int
    used: float

    @property
    def lost(self) -> anyio.Event: ...

    @property
    def client(self) -> object | None: ...


@dataclass(frozen=True, slots=True, eq=False)
class _Waiting:
    """A call waiting for its turn: set ``sent`` to send it to ``session``."""

    sent: anyio.Event
    session: Session


async def _timed(ping: Callable[[], Awaitable[str | None]]) -> float | None:
    """Seconds ``ping`` took to be answered; None if it was not."""
    started = anyio.current_time()
    unanswered = await ping()
    return anyio.current_time() - started if unanswered is None else None
