"""What the gateway refused to protect everyone else, counted and logged in one place.

Every bound against a noisy or hostile party (connections, request heads, rate limits,
sessions, bodies, names, bytes in flight) ends here: one metric,
``agent_gateway.refusals{reason}``, and one WARNING line whose values are cut to a bounded
length (a client chooses them, so it must not choose how much is written). Nor how many: the
lines of one kind about one party (``peer``, the client's label where one is known) are
written once per ten seconds, the count of those left out with the next (``logs.PeerRepeats``);
every refusal is counted in the metric all the same.
"""

from __future__ import annotations

import logging

from opentelemetry import metrics

from agent_gateway.logs import clipped

logger = logging.getLogger("agent_gateway.refusals")

refusals = metrics.get_meter("agent-gateway").create_counter(
    "agent_gateway.refusals",
    description="Requests and connections refused by a bound, by reason (connections, "
    "header_timeout, rate_limit, sessions, sessions_all, session_made_way, subscriptions, body, "
    "name, in_flight, concurrency, upstream_share, dedicated_sessions, checks, token, pipelined, pages; "
    "events: stream events past a client's share not kept for a resume; "
    "token_rotated: a session or request a reload ended, opened or sent with a static token's "
    "secret the reload replaced; token_removed: a request a reload ended, sent with a token it "
    "took out).",
)


def refused(reason: str, message: str, *values: object, level: int = logging.WARNING, peer: str = "") -> None:
    """Count one refusal for ``reason`` and log ``message % values`` (values clipped) about
    ``peer`` (empty: no one party)."""
    refusals.add(1, {"reason": reason})
    if logger.isEnabledFor(level):
        logger.log(level, message, *(clipped(v) for v in values), extra={"peer": peer})
