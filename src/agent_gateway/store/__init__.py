"""State several replicas share (``store:`` in ``gateway.yaml``): Redis for what is hot and
short-lived. Without ``store:`` none of this exists and each replica keeps its own state.

- ``state``: every part below over one Redis client, built only where ``store:`` is set.
- ``client``: the connection, its health, the one clear error when it is missing.
- ``limits``: rate limits and live-session counts, one round trip per request.
- ``sessions``: handshake-era session records, so any replica adopts any session.
- ``keeper``: the records the store lost, written again by the replica serving their sessions.
- ``events``: the SSE event store, so a dropped stream resumes on any replica.
- ``leases``: one ``ask_agent`` run at a time on a conversation, across replicas.
- ``holders``: which replica holds each resource subscription; a dead one's are claimed.
- ``bus``: announcements between replicas (a session deleted or its log level set, an
  upstream's lists changed, a notification for a session whose stream another replica holds).
- ``rounds``: a held call's round served by the replica holding it, for a retry another got.
- ``room``: a client's session no replica serves ended for its new one at its ``max_sessions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_gateway.config import GatewayConfig

if TYPE_CHECKING:
    from agent_gateway.store.state import SharedState


def shared_state(config: GatewayConfig) -> SharedState | None:
    """What the replicas share, or None without ``store:``.

    Imported here, not above: Redis's client takes ~0.13 s of a start (10 % of the gateway's
    imports), and a gateway without ``store:`` never uses it. ``store.record`` and the
    modules that only name the store's types are read without it."""
    if config.store is None:
        return None
    from agent_gateway.store.state import SharedState

    return SharedState(config, config.store)
