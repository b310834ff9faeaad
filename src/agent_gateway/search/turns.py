"""The tool index's turns: one user at a time, and one place in the queue per party.

The index has one user at a time (its SQLite connection and the postings it keeps), and its
users queued first come, first served: one client sending hundreds of searches at once put
every other client's search, an agent run's, and the re-indexing that follows a catalog
change behind all of them (at 10,000 tools, 20 ms a search of common words: seconds each).
Here a party's users queue behind one another first, so the party holds one place in the
index's queue however many it sends, and every other party waits behind at most one of its.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

import anyio


class Turns:
    """One user at a time, taken in turns by party (anyio's locks are first come, first served)."""

    def __init__(self) -> None:
        self._turn = anyio.Lock()
        self._parties: dict[Hashable, tuple[anyio.Lock, int]] = {}
        """Each party with a user waiting or served: its own queue, and how many are in it."""

    @asynccontextmanager
    async def taken(self, party: Hashable) -> AsyncIterator[None]:
        """The turn, for one of ``party``'s users: after each of its own users before it."""
        queue, users = self._parties.get(party, (None, 0))
        queue = queue or anyio.Lock()
        self._parties[party] = (queue, users + 1)
        try:
            async with queue, self._turn:  # the turn is let go first: the next party's, then ours
                yield
        finally:
            queue, users = self._parties[party]
            if users == 1:
                del self._parties[party]
            else:
                self._parties[party] = (queue, users - 1)

    def parties(self) -> int:
        """Parties with a user waiting or served now."""
        return len(self._parties)

    def users(self) -> int:
        """Users waiting or served now, of every party."""
        return sum(users for _, users in self._parties.values())
