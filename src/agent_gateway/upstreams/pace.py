"""How fast the gateway reads what an upstream sends unasked: its notifications and requests.

The SDK's client starts a task for each notification an upstream sends, and the gateway then
relays it, so an upstream writing small notifications as fast as its pipe takes them cost the
gateway a core: 300,000 log lines of 100 bytes took 20 s of its CPU, and every other client's
calls waited behind them (p99 185 ms, ``bench/README.md``). Each upstream session's own
notifications and requests are now taken at most ``notification_rate`` a second (a second's
worth at once); past that the gateway waits before it reads the next message, so the upstream's
writes wait in its pipe or socket. Nothing is dropped: the upstream is read more slowly, and
only its own clients wait for it. Answers to the gateway's requests are not counted (the
gateway bounds those itself: ``max_concurrency``), but they wait behind what comes before them.
"""

from __future__ import annotations

import logging

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

from agent_gateway.tally import notifications_held
from agent_gateway.token_bucket import TokenBucket

logger = logging.getLogger(__name__)


class Pace:
    """How fast one upstream session's notifications and requests are read: ``rate`` a second,
    ``rate`` at once; None: no bound."""

    def __init__(self, upstream: str, label: str, rate: int | None) -> None:
        self._upstream = upstream
        self._label = label
        self._rate = rate
        self._bucket = TokenBucket(rate, rate) if rate is not None else None

    def counts(self, item: SessionMessage | Exception) -> bool:
        """Whether ``item`` is one the upstream sent unasked (a notification or a request)."""
        return isinstance(item, SessionMessage) and isinstance(
            item.message, types.JSONRPCNotification | types.JSONRPCRequest
        )

    async def take(self) -> None:
        """Take one message's turn, waiting for it while the upstream is over its rate."""
        if self._bucket is None:
            return
        wait = self._bucket.take()
        if wait is None:
            return
        notifications_held.add(1, {"upstream": self._upstream})
        logger.warning(
            "upstream session %s sends over %d notifications and requests a second "
            "(notification_rate): read more slowly",
            self._label,
            self._rate,
            extra={"peer": self._label},
        )
        while wait is not None:
            await anyio.sleep(wait)
            wait = self._bucket.take()
