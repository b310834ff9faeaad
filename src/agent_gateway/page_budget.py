"""Each client's budget of bytes of the heavy GETs: the status page (``/`` and its live part),
``/status`` and ``/metrics``.

They are rendered at most once a second whoever asks (``rendered.py``), but each answer is
bytes the event loop writes, and nothing else bounds how often one client asks: four clients
polling a 10,000-tool page (18 MB) flat out made a bystander's calls 2-3.5 times slower at
p50 and 13-20 times at p99 (``bench/status_polling.py``). So each client (the same identity as MCP
admission: its verified token, else its address) may be sent ``server.page_bytes_per_second``
of them on average, ``PAGE_BURST`` seconds of it at once. An answer is served whole while the
client's budget is above nothing, and charged after (a page larger than the burst is still
served, then paid for); past it, 429 with ``Retry-After``, a few hundred bytes the loop writes
in place of megabytes, held up to a second first (``HOLD``, four of a client's at a time): a
poller that asks again at once is refused as often as it holds connections, not as fast as the
loop can answer. ``/healthz`` and ``/readyz`` are not counted: load balancers poll them,
and their answers are small (polled flat out, they cost what any request does).

Counted per replica, as a client's other counts without a shared store.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

import anyio

from agent_gateway.access import AccessControl, Principal, address_of_scope, token_of_scope
from agent_gateway.refusals import refused
from agent_gateway.store.limits import retry_after
from agent_gateway.token_bucket import ByteBudget, Clock
from agent_gateway.turns import away

SMALLEST = 64 << 10
"""Bytes an answer is charged at least: a request costs the loop its routing and its answer's
making whatever its size (four clients asking for ``/status``'s 0.6 KB flat out made a bystander's
calls three times slower), so a client polling a small page is bounded too (16 a second)."""
HOLD = 1.0
"""Seconds a refusal is held at most before it is answered."""
HELD = 4
"""A client's refusals held at once; the rest are answered at once."""
PAGE_BURST = 32
"""Seconds of a client's budget it may spend at once: a person's first load of a large page
(18 MB at 10,000 tools, 1 MiB a second) and a reload or two after it are served at once."""


class PageBudgets:
    """The budgets of every client ``access`` knows, forgotten with it (``AccessControl`` drops
    idle clients only past 10,000 of them)."""

    def __init__(self, access: AccessControl, per_second: int, clock: Clock = time.monotonic) -> None:
        self._access = access
        self._rate = per_second
        self._clock = clock
        self._budgets: WeakKeyDictionary[Principal, ByteBudget] = WeakKeyDictionary()
        """Each client's, for as long as ``access`` keeps the client."""
        self._holding: Counter[str] = Counter()
        """Each client's refusals being held now (none kept at zero)."""

    async def refusal(self, scope: Mapping[str, Any], what: str) -> tuple[str, int] | None:
        """Why the client of the request ``scope`` may not be sent ``what`` now, and the
        seconds it is told to wait (``Retry-After``); None: it may (then ``charge`` it). Asked
        before the answer is made: a refused request costs no rendering, nor a copy of it.
        A refusal is held up to ``HOLD`` seconds first, ``HELD`` of a client's at a time."""
        client = self._client(scope)
        budget = self._budgets.get(client)
        if budget is None:
            budget = self._budgets[client] = ByteBudget(self._rate, self._rate * PAGE_BURST, self._clock)
        if (wait := budget.wait()) is None:
            return None
        refused("pages", "client %s over its budget of pages (%s)", client.label, what, peer=client.label)
        held = await self._held(client.label, min(wait, HOLD))
        seconds = retry_after(wait - held)
        why = (
            f"client {client.subject!r} was sent more of the status page, /status and /metrics than "
            f"{self._rate} bytes a second (server.page_bytes_per_second); retry in {seconds}s"
        )
        return why, seconds

    async def _held(self, label: str, seconds: float) -> float:
        """Holds a refusal of the client ``label`` for ``seconds`` unless ``HELD`` of its are
        held already; the seconds it was held. A poller that asks again at once, whatever
        ``Retry-After`` says, is then refused as often as it holds connections, not as fast as
        the loop answers (a 429 costs the loop what a small page does)."""
        if self._holding[label] >= HELD:
            return 0.0
        self._holding[label] += 1
        try:
            async with away():  # not its client's work: its other requests are worked on meanwhile
                await anyio.sleep(seconds)
        finally:
            self._holding[label] -= 1
            if not self._holding[label]:
                del self._holding[label]
        return seconds

    def charge(self, scope: Mapping[str, Any], size: int) -> None:
        """Charge the client of the request ``scope`` for an answer of ``size`` bytes."""
        if (budget := self._budgets.get(self._client(scope))) is not None:  # None: forgotten since
            budget.spend(max(size, SMALLEST))

    def _client(self, scope: Mapping[str, Any]) -> Principal:
        return self._access.principal(token_of_scope(scope), address_of_scope(scope))
