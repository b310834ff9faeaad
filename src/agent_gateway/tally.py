"""Counters bumped on every call, counted in a dict and read by the OpenTelemetry SDK only
when metrics are collected (``telemetry.py`` holds the rest of the gateway's metrics)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Observation

from agent_gateway.telemetry import meter


class Tally:
    """A counter counted in a dict, read by the SDK through an observable instrument when
    metrics are collected: one dict update per call where a synchronous measurement costs
    ~10 us (two of a modern call's five were counters: 4 % of its instructions, measured with
    ``bench/instructions_per_call.py``). The same exported sum and attributes (cumulative)."""

    def __init__(self, name: str, description: str, *, monotonic: bool = True) -> None:
        self._totals: dict[tuple[tuple[str, str], ...], int] = {}
        create = meter.create_observable_counter if monotonic else meter.create_observable_up_down_counter
        create(name, callbacks=[self._observe], description=description)

    def add(self, amount: int, attributes: Mapping[str, str]) -> None:
        key = tuple(attributes.items())
        self._totals[key] = self._totals.get(key, 0) + amount

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        # A copy: the collecting thread (OTLP's reader) reads while the event loop counts.
        return [Observation(total, dict(key)) for key, total in self._totals.copy().items()]


http_answers = Tally(
    "agent_gateway.http.answers",
    "HTTP calls answered in their POST's task, by how: json (one body), stream (the "
    "call sent something first), idle (silent past the keepalive interval), ended (the session "
    "ended first) or abandoned (the client hung up first); mcp.era=modern for modern-era calls.",
)
sessions_active = Tally("agent_gateway.sessions.active", "Downstream MCP sessions open now.", monotonic=False)
held_rounds = Tally(
    "agent_gateway.held_calls.rounds",
    "Rounds of modern clients' calls held for a handshake-era upstream's questions, by outcome: "
    "asked (answered with InputRequiredResult), answered (the call's result), given_up (the "
    "client cancelled the round: the call is cancelled upstream), unanswered (a question went "
    "unanswered for its time: the call is cancelled upstream); and on a replica that got a "
    "retry of a call another holds: sent_across (sent to the holder), holder_gone (it is gone).",
)
notifications_held = Tally(
    "agent_gateway.upstream.notifications.held",
    "Notifications and requests an upstream sent unasked that the gateway waited before reading, "
    "by upstream: the session was over its notification_rate (nothing is dropped; the upstream "
    "is read more slowly).",
)
requests_refused = Tally(
    "agent_gateway.upstream.requests.refused",
    "Requests an upstream sent (ping, sampling, elicitation, roots) answered with an error unread, "
    "by upstream: 256 of its session's requests were being answered already.",
)
notifications_dropped = Tally(
    "agent_gateway.notifications.dropped",
    "Log lines, progress reports and resource updates from upstreams not passed on, by kind (log, "
    "progress, resource_updated) and why: behind (16 lines no call owns, or 64 resource updates, "
    "were waiting for the client already), backlog (an "
    "upstream session already had its bound of them being passed on: its clients read slower "
    "than it sends) or rate (over 100 lines a second no call owns from one upstream); URL elicitations' "
    "completions naming an id the upstream session showed no handshake-era client (kind elicitation_complete, why "
    "unknown); and "
    "notifications of a method MCP does not define (kind unknown, why method), which nothing reads.",
)
