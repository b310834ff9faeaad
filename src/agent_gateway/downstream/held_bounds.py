"""How many calls may wait for clients' answers (``held_calls.py``): per client, per
upstream, and in all.

A held call keeps its upstream call running, and so one of that upstream's
``max_concurrency`` slots, while it waits for a client that need keep no connection open.
Counted per client alone, 17 anonymous loopback addresses of one process held all 200 slots
of an upstream for its call timeout, again and again, with one burst of requests each time:
every other client's calls to it were refused (a helper's attack). Calls waiting on one
upstream therefore take at most half its slots; the other half serve calls that are running.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

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
    """A call waiting for its client's answers."""

    @property
    def client(self) -> str:
        """Its client's label."""
        ...  # a Protocol member: the signature is the contract

    @property
    def upstream(self) -> str:
        """The upstream that asked (empty: none yet)."""
        ...  # a Protocol member: the signature is the contract


def over_bound(
    waiting: Sequence[Waiting], client: Principal | None, upstream: str | None, upstream_limit: int | None
) -> str | None:
    """Why one more call of ``client`` may not wait, ``upstream`` asking it (None: not known
    yet), whose ``max_concurrency`` is ``upstream_limit``; None: it may."""
    label = client.label if client is not None else ""
    mine = sum(1 for held in waiting if held.client == label)
    own = client.policy.max_concurrency if client is not None else None
    if mine >= min(own or PER_CLIENT, PER_CLIENT):
        refused("held_calls", "client %s refused a held call (%d waiting for it)", label, mine, peer=label)
        return f"{mine} calls waiting for this client's answers; answer or cancel them first"
    if upstream is not None and upstream_limit is not None:
        there = sum(1 for held in waiting if held.upstream == upstream)
        if there >= max(1, int(upstream_limit * UPSTREAM_SHARE)):
            refused(
                "held_calls",
                "client %s refused a held call (%d waiting on upstream %s)",
                label,
                there,
                upstream,
                peer=label,
            )
            return (
                f"upstream {upstream!r} has {there} calls waiting for clients' answers, half of its "
                f"max_concurrency ({upstream_limit}); retry later"
            )
    if len(waiting) >= MAX_HELD:
        refused("held_calls", "client %s refused a held call (%d waiting in all)", label, len(waiting))
        return f"the gateway holds {len(waiting)} calls waiting for clients' answers; retry later"
    return None
