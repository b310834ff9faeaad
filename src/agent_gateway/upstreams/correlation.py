"""Which responses an upstream may send: answers to requests the gateway sent on that session,
matched by their exact id.

The ``mcp`` client matches a response to a pending request after coercing a string id that
spells an integer (``"7"`` answers request ``7``), so an upstream writing stray responses
could resolve a call of that session with an answer meant for nothing. Here a response
passes only if its id, with its JSON type, is one this session sent and has not yet had an
answer for; any other is dropped with a warning and resolves nothing. A late answer to a
request the gateway cancelled is dropped quietly (answering after a cancel is allowed).

What a response that does carry an open id says is that request's answer: on the wire it
cannot be told from the upstream answering, and the request is the upstream's to answer.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import anyio
import mcp_types as types
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage

from agent_gateway.compat.mcp import WriteStream
from agent_gateway.compat.streams import StreamWrapper
from agent_gateway.upstreams.pace import Pace

logger = logging.getLogger(__name__)

_CANCELLED_KEPT = 1024
"""Cancelled ids remembered, so their late answers are dropped quietly."""
_SHOWN = 64
"""Characters of a stray id shown in the log line (the upstream chose it)."""


class SentRequests:
    """The ids of one upstream session's requests still waiting for an answer."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._open: set[types.RequestId] = set()
        self._cancelled: deque[types.RequestId] = deque(maxlen=_CANCELLED_KEPT)

    def note(self, item: SessionMessage) -> None:
        """Record an outgoing message: a request opens its id, a cancel closes it."""
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            self._open.add(message.id)
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            request_id = cancelled_request_id_from_params(message.params)
            if request_id is not None and request_id in self._open:
                self._open.discard(request_id)
                self._cancelled.append(request_id)

    def admits(self, item: SessionMessage) -> bool:
        """Whether an incoming message goes on: anything but a response to no open request."""
        message = item.message
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return True
        request_id = message.id
        if request_id is not None and request_id in self._open:
            self._open.discard(request_id)
            return True
        if request_id is not None and request_id in self._cancelled:
            logger.debug("upstream session %s answered cancelled request %r late", self._label, request_id)
        else:
            logger.warning(
                "upstream session %s: dropped a response to an id never sent on this session "
                "(or already answered): %.*r",
                self._label,
                _SHOWN,
                request_id,
                extra={"peer": self._label},
            )
        return False


class RecordingWriteStream(StreamWrapper[WriteStream[SessionMessage]]):
    """A transport's write stream that notes each message in ``sent`` before sending it, and
    each answer to the upstream's requests in ``pace`` once it is sent; a send finding the
    write side gone tells ``writes_ended`` (its transport's writer stopped alone)."""

    def __init__(
        self,
        inner: WriteStream[SessionMessage],
        sent: SentRequests,
        pace: Pace,
        writes_ended: Callable[[str], None],
    ) -> None:
        self._inner = inner
        self._sent = sent
        self._pace = pace
        self._writes_ended = writes_ended

    async def send(self, item: SessionMessage, /) -> None:
        self._sent.note(item)
        try:
            await self._inner.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._writes_ended("its transport stopped sending")
            raise
        self._pace.answered(item)
