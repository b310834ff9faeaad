"""How many calls may wait for clients' answers (``held_calls.py``): per client, per
upstream, and in all.

A held call keeps its upstream call running, and so one of that upstream's
``max_concurrency`` slots, while it waits for a client that need keep no connection open.
Counted per client alone, 17 anonymous loopback addresses of one process held all 200 slots
of an upstream for its call timeout, again and again, with one burst of requests each time:
every other client's calls to it were refused (a helper's attack). Calls waiting on one
upstream therefore take at most half its slots; the other half serve calls that are running.
Past that half, a client holding fewer there than another has the oldest call of the one
holding the most ended for it: an attacker of many addresses cannot keep the room from a
client that asks for one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol, TypeVar

from agent_gateway.access import Principal
from agent_gateway.refusals import refused

MAX_HELD = 1024
"""Calls held at once, all clients together."""
PER_CLIENT = MAX_HELD // 4
"""Calls held at once for one client whose policy sets no lower ``max_concurrency`` (or
none): no client takes more than a quarter of the room."""
UPSTREAM_SHARE = 0.5
"""The part of an upstream's ``max_concurrency`` its calls waiting for answers may take."""


class Waiting(Protocol):
    """A call waiting for its client's answers (``held_calls._Held``)."""

    client: str
    """Its client's label."""
    upstream: str
    """The upstream that asked (empty: none yet)."""
    done: bool
    """Its upstream call has ended (its outcome waits for the client's retry)."""
    serving: bool
    """A round of it is being served: its client is there."""


W = TypeVar("W", bound=Waiting)


def over_bound(waiting: Sequence[Waiting], client: Principal | None) -> str | None:
    """Why one more call of ``client`` may not wait (None: it may), by its own bound and the
    gateway's."""
    label = client.label if client is not None else ""
    mine = sum(1 for held in waiting if held.client == label)
    own = client.policy.max_concurrency if client is not None else None
    if mine >= min(own or PER_CLIENT, PER_CLIENT):
        refused("held_calls", "client %s refused a held call (%d waiting for it)", label, mine, peer=label)
        return f"{mine} calls waiting for this client's answers; answer or cancel them first"
    if len(waiting) >= MAX_HELD:
        refused("held_calls", "client %s refused a held call (%d waiting in all)", label, len(waiting))
        return f"the gateway holds {len(waiting)} calls waiting for clients' answers; retry later"
    return None


def upstream_room(
    waiting: Sequence[W], client: Principal | None, upstream: str, limit: int | None
) -> W | str | None:
    """Room for one more call of ``client`` waiting on ``upstream``, whose ``max_concurrency``
    is ``limit``: None, there is some; a call to end for it, the oldest of the client holding
    the most there when it holds two more than ``client`` (and so no fewer after; as
    ``downstream/room.py`` makes room for sessions), none in a round; else why there is none."""
    there = [held for held in waiting if held.upstream == upstream and not held.done]
    if limit is None or len(there) < max(1, int(limit * UPSTREAM_SHARE)):
        return None
    label = client.label if client is not None else ""
    counts = Counter(held.client for held in there)
    endable = [held for held in there if not held.serving and counts[held.client] > counts[label] + 1]
    if endable:
        return max(endable, key=lambda held: counts[held.client])  # the first of the most: the oldest
    refused(
        "held_calls",
        "client %s refused a held call (%d waiting on upstream %s)",
        label,
        len(there),
        upstream,
        peer=label,
    )
    return (
        f"upstream {upstream!r} has {len(there)} calls waiting for clients' answers, half of its "
        f"max_concurrency ({limit}); retry later"
    )
