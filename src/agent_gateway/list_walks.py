"""Where a client's walk of a list (``tools/list``, ``prompts/list``, ...) goes on when the
catalog changed between two of its pages.

A cursor names the position after the last item of its page, the catalog version it was made
in and that item's key. In the same list the position is all it takes. In a list changed
since, a position alone shifts with every item added or removed before it: a client walking
10 pages while an upstream ahead of it dropped 2 tools missed 2 tools that never changed, and
one that added 2 saw 2 twice. So the walk goes on just after that last item wherever it now
is; or, when it is gone, after the last item of the walk that is still listed (found in the
list the cursor was made in, while it is kept); or from the start when none is. Items keep
their relative order across versions (upstreams in configuration order, each one's items in
its own order), so the client sees no item twice and misses none that stayed listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Place:
    """What a cursor says: the position after its page, and (a cursor of this gateway's since
    walks were resumed by key) the list's version and the key of the page's last item."""

    offset: int
    version: int | None = None
    key: str | None = None


class Walked(Protocol):
    """A list one client walks, in one catalog version."""

    def __len__(self) -> int: ...

    def key(self, index: int) -> str:
        """The key of the item at ``index``."""
        ...

    def position(self, key: str) -> int | None:
        """The index of the item of key ``key``, if listed."""
        ...


def resumed(place: Place, now: Walked, then: Walked | None) -> int:
    """Where the walk ``place`` was made in goes on in ``now``; ``then`` is the list the cursor
    was made in, if still kept (None: a position is all there is to go by)."""
    offset = place.offset
    if place.key is None or (0 < offset <= len(now) and now.key(offset - 1) == place.key):
        return offset
    if (found := now.position(place.key)) is not None:
        return found + 1
    if then is None or not 0 < offset <= len(then) or then.key(offset - 1) != place.key:
        return offset  # not the list it was made in (another replica's, say): as before
    for index in range(offset - 2, -1, -1):  # the walk's last item still listed
        if (found := now.position(then.key(index))) is not None:
            return found + 1
    return 0  # nothing it saw is listed any more
