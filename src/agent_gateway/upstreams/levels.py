"""The log level one handshake-era upstream session runs at: the level last asked of it, and
the one its upstream last answered for, sent one at a time.

Clients come and go at once, and each change is decided from the level asked before it, not
from the last one answered: deciding from the answered one, a client leaving while the level
its neighbour's leaving asked for was still on its way saw the older level in place and sent
nothing, and the upstream stayed at a level no client had asked for (``error``: every other
client's info lines lost until the next change). A send that fails or is given up on (it may
yet be applied upstream) leaves both levels ``UNSURE``: the next change sends what it wants.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, Literal

import anyio
import mcp_types as types

logger = logging.getLogger(__name__)

Unsure = Literal["unsure"]
UNSURE: Final[Unsure] = "unsure"
"""Not a level: the upstream's may be any (a send failed, timed out, or is on its way)."""


class Level:
    """A session's log level (its ``level``): ``ask`` one, then ``apply`` it."""

    def __init__(self, session: str, send: Callable[[types.LoggingLevel], Awaitable[bool]]) -> None:
        """``send``: tell the upstream a level; whether it took it (False: it does not
        implement setLevel, so it certainly runs at the level it had)."""
        self._session = session
        self._send = send
        self.asked: types.LoggingLevel | Unsure | None = None
        """The level last asked for (None: never; the upstream's own default)."""
        self.sent: types.LoggingLevel | Unsure | None = None
        """The level the upstream last answered for."""
        self._sending = anyio.Lock()

    def ask(self, level: types.LoggingLevel) -> None:
        """``level`` is the one to run at now; every later decision starts from it. Synchronous,
        before ``apply`` is started: a change decided meanwhile sees it."""
        self.asked = level

    async def apply(self, level: types.LoggingLevel) -> None:
        """Send ``level`` unless the upstream holds it already; levels asked one after another
        are sent in that order (the lock is first come, first served), so the last one asked
        is the one that stays."""
        taken = False
        try:
            # One at a time: each held a slot of the upstream's until its answer set the level
            # sent, so a client's flood of one level took them all and sent it again and again.
            async with self._sending:
                if self.sent == level:
                    taken = True
                    return
                # A send given up on (out of time, cancelled) may still be applied upstream.
                before, self.sent = self.sent, UNSURE
                if await self._send(level):
                    self.sent, taken = level, True
                    logger.info("log level %s applied on %s", level, self._session)  # only when it changes
                else:
                    self.sent = before
        finally:
            # Not taken (refused, out of time, cancelled waiting its turn): the level the
            # upstream runs at is not known, so the next change sends the one it wants.
            if not taken and self.asked == level:
                self.asked = UNSURE
