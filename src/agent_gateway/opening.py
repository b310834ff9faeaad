"""A request without a session id, counted as opening a session from admission until the
session registry counts the session it opened (or the request ends without one).

Two counts see it: its client's (``Principal.opening``, against the client's
``max_sessions``) and, for a handshake-era ``initialize``, this replica's
(``Openings.count``, against ``server.max_sessions``: the sessions the gateway keeps for
their idle timeout). Counted until then, so that requests opening sessions at once cannot all
pass a bound that has room for one; no longer after, else a session whose answer is still
being written (16 MB of instructions to a slow reader, say) was counted twice and its client
refused short of its ``max_sessions``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable

from starlette.types import Message, Send

from agent_gateway.access import Principal

_SESSION_HEADER = b"mcp-session-id"


class Openings:
    """This replica's handshake-era requests opening a session, not yet counted open."""

    def __init__(self) -> None:
        self.count = 0


class Opening:
    """One request counted as opening a session for its client (and, with ``openings``, for
    this replica) from ``with`` until ``session_opened`` or the block's end. A class, not a
    generator: every modern-era request enters one."""

    __slots__ = ("_token", "client", "counted", "openings")

    def __init__(self, client: Principal, openings: Openings | None) -> None:
        self.client = client
        self.openings = openings
        self.counted = False

    def __enter__(self) -> None:
        self.counted = True
        self.client.opening += 1
        if self.openings is not None:
            self.openings.count += 1
        self._token = _OPENING.set(self)

    def __exit__(self, *_: object) -> None:
        _OPENING.reset(self._token)
        self.uncount()

    def uncount(self) -> None:
        if not self.counted:
            return
        self.counted = False
        self.client.opening -= 1
        if self.openings is not None:
            self.openings.count -= 1


_OPENING: contextvars.ContextVar[Opening | None] = contextvars.ContextVar(
    "agent_gateway_opening", default=None
)
"""The request being served that is counted as opening a session (until it has)."""


def session_opened(client: Principal) -> None:
    """The session the request being served was opening is open, and counted as such by the
    session registry: no longer as opening too."""
    entry = _OPENING.get()
    if entry is not None and entry.client is client:
        entry.uncount()


class Opened:
    """A ``send`` that notes the session id an opening request's answer gives the client, and
    counts it in the shared store (``settle``) before that answer starts: settled after the
    answer, its client's next ``initialize`` could come first and find both the session and
    its opening's place counted, one too many (which ended another of its sessions for it)."""

    def __init__(self, send: Send, settle: Callable[[str | None], Awaitable[None]] | None = None) -> None:
        self._send = send
        self._settle = settle
        self.session: str | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if message["status"] < 400:
                for name, value in message.get("headers", ()):
                    if name.lower() == _SESSION_HEADER:
                        self.session = bytes(value).decode("latin-1")
            await self.settled()
        await self._send(message)

    async def settled(self) -> None:
        """Settle the opening's place now, once (the request's end settles one never answered)."""
        settle, self._settle = self._settle, None
        if settle is not None:
            await settle(self.session)
