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
import math
import time

import anyio
import mcp_types as types
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types.methods import SERVER_NOTIFICATIONS

from agent_gateway.tally import notifications_dropped, notifications_held, requests_refused
from agent_gateway.token_bucket import TokenBucket

logger = logging.getLogger(__name__)


MAX_ASKED = 256
"""An upstream session's requests (``ping`` among them) being answered at once: the SDK starts a
task for each, and an upstream sending pings flat out while accepting the answers slowly held
51,683 of them (835 MB). Its questions for clients (sampling, elicitation, roots) wait for
those clients, so they are not waited for here: one more is answered with an error at once."""


STEP = 0.05
"""Seconds of its rate a session over it is read in, each time it is read again: one message a
wake-up of the reader, its turns of the event loop were a third of what the gateway spent on
an upstream sending without end at 1,000 a second (and every second of its reading the same)."""
WARN_EVERY = 10.0
"""Seconds between two warnings that a session is over its rate: a line a message held (the
log's filter dropped the repeats, once made) was another sixth of that cost."""

_HEEDED = frozenset(method for method, _ in SERVER_NOTIFICATIONS)
"""The notifications an upstream may send that the SDK's client session acts on, in any version."""


class Pace:
    """How fast one upstream session's notifications and requests are read: ``rate`` a second,
    ``rate`` at once (None: no bound); and how many of its requests are answered at once."""

    def __init__(self, upstream: str, label: str, rate: int | None) -> None:
        self._upstream = upstream
        self._label = label
        self._rate = rate
        self._bucket = TokenBucket(rate, rate) if rate is not None else None
        self._asked: set[types.RequestId] = set()
        """The ids of the upstream's requests whose answers are not yet sent."""
        self._warned = -math.inf
        """When the session was last warned of as over its rate (``WARN_EVERY``)."""

    @property
    def label(self) -> str:
        """The session's, as its log lines name it."""
        return self._label

    def counts(self, item: SessionMessage | Exception) -> bool:
        """Whether ``item`` is one the upstream sent unasked (a notification or a request)."""
        return isinstance(item, SessionMessage) and isinstance(
            item.message, types.JSONRPCNotification | types.JSONRPCRequest
        )

    def heeded(self, item: SessionMessage) -> bool:
        """Whether ``item`` (one that ``counts``) is passed to the session: a request, or a
        notification of a method MCP defines. The SDK drops any other (no binding is ever
        registered) only after a task, a parse and a debug line each: an upstream sending
        those without end took 22 % of a core at the pace, its bystanders' p50 4 -> 15 ms."""
        message = item.message
        if not isinstance(message, types.JSONRPCNotification) or message.method in _HEEDED:
            return True
        notifications_dropped.add(1, {"kind": "unknown", "why": "method"})
        return False

    async def take(self, item: SessionMessage) -> types.JSONRPCError | None:
        """Take ``item``'s turn, waiting for it while the upstream is over its rate; for a
        request past ``MAX_ASKED`` being answered, the error it is answered with instead."""
        await self._rate_turn()
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            return self._refusal(message.id)
        if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            # The SDK may then answer nothing: its place is free.
            self._forget(cancelled_request_id_from_params(message.params))

    async def take_report(self) -> None:
        """The turn of a notification on a forwarded call's stream (which holds no requests)."""
        await self._rate_turn()

    def answered(self, item: SessionMessage) -> None:
        """``item`` was sent to the upstream: an answer frees its request's place."""
        if isinstance(item.message, types.JSONRPCResponse | types.JSONRPCError):
            self._forget(item.message.id)

    async def _rate_turn(self) -> None:
        if self._bucket is None or (wait := self._bucket.take()) is None:
            return
        notifications_held.add(1, {"upstream": self._upstream})
        if (now := time.monotonic()) >= self._warned + WARN_EVERY:
            self._warned = now
            logger.warning(
                "upstream session %s sends over %d notifications and requests a second "
                "(notification_rate): read more slowly",
                self._label,
                self._rate,
                extra={"peer": self._label},
            )
        while wait is not None:
            await anyio.sleep(wait + STEP)
            wait = self._bucket.take()

    def _refusal(self, request_id: types.RequestId) -> types.JSONRPCError | None:
        if len(self._asked) < MAX_ASKED:
            self._asked.add(request_id)
            return None
        requests_refused.add(1, {"upstream": self._upstream})
        logger.warning(
            "upstream session %s has %d requests being answered: one more refused",
            self._label,
            MAX_ASKED,
            extra={"peer": self._label},
        )
        message = f"agent-gateway: {MAX_ASKED} of this session's requests are being answered; not taken"
        error = types.ErrorData(code=types.INTERNAL_ERROR, message=message)
        return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)

    def _forget(self, request_id: object) -> None:
        self._asked.discard(request_id)  # pyright: ignore[reportArgumentType]
