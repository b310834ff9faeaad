"""One client's ``ask_agent`` budget: runs started per minute, model tokens over the last
hour (a paid provider bills per token), as its policy sets them."""

from __future__ import annotations

import time
from collections import deque

from agent_gateway.config_auth import AgentBudget
from agent_gateway.errors import ClientLimited
from agent_gateway.refusals import refused
from agent_gateway.token_bucket import Clock, TokenBucket


class AgentSpend:
    """One client's ``ask_agent`` runs per minute and model tokens over the last hour."""

    def __init__(
        self, runs: TokenBucket | None, tokens_per_hour: int | None, clock: Clock = time.monotonic
    ) -> None:
        self._runs = runs
        self._per_hour = tokens_per_hour
        self._clock = clock
        self._used: deque[tuple[float, int]] = deque()

    def start(self, subject: str) -> None:
        """Raises ``ClientLimited`` when a new run would pass the client's agent budget."""
        if self._per_hour is not None and (used := self._last_hour()) >= self._per_hour:
            refused("agent_budget", "client %s over its agent tokens_per_hour", subject, peer=subject)
            raise ClientLimited(
                f"{used} model tokens in the last hour, the limit (agent.tokens_per_hour) is {self._per_hour}"
            )
        if self._runs is not None and (wait := self._runs.take()) is not None:
            refused("agent_budget", "client %s over its agent runs_per_minute", subject, peer=subject)
            raise ClientLimited(f"agent runs over the limit (agent.runs_per_minute): retry in {wait:.1f}s")

    def used(self, tokens: int) -> None:
        if self._per_hour is not None and tokens > 0:
            self._used.append((self._clock(), tokens))

    def _last_hour(self) -> int:
        since = self._clock() - 3600
        while self._used and self._used[0][0] < since:
            self._used.popleft()
        return sum(n for _, n in self._used)


def spend_of(
    budget: AgentBudget, clock: Clock = time.monotonic, kept: AgentSpend | None = None
) -> AgentSpend:
    """The spend ``budget`` allows; ``kept``: the client's spend so far, whose tokens of the
    last hour still count (a reload changing the budget does not forgive them)."""
    runs = budget.runs_per_minute
    bucket = TokenBucket(runs / 60.0, max(1, int(runs)), clock) if runs else None
    spend = AgentSpend(bucket, budget.tokens_per_hour, clock)
    if kept is not None:
        spend._used = kept._used  # pyright: ignore[reportPrivateUsage]
    return spend
