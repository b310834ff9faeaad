"""``store:``: the state several replicas share (Redis); absent, each replica keeps its own."""

from __future__ import annotations

from pydantic import Field

from agent_gateway.config_base import Seconds
from agent_gateway.config_base import Strict as _Strict


class EventsConfig(_Strict):
    """What a dropped SSE stream can get back (``Last-Event-ID``), kept in the shared store."""

    ttl: Seconds = 300.0
    """An event older than this is gone; a client reconnecting later starts afresh."""
    per_stream: int = Field(default=1000, ge=1, le=1_000_000)
    """Events kept per stream (the newest)."""


class StoreConfig(_Strict):
    """The state several replicas share: sessions, rate limits, session counts, stream events
    and catalog changes, in Redis."""

    url: str = Field(pattern=r"^rediss?://", repr=False)
    """``redis://[user:password@]host:port/db`` (``rediss://`` for TLS); never logged."""
    prefix: str = Field(default="agw", pattern=r"^[A-Za-z0-9_.:-]{1,32}$")
    """Every key and channel starts with it: two gateways on one Redis use two prefixes."""
    timeout: Seconds = 2.0
    """A store operation that takes longer has failed: the request goes on without it."""
    events: EventsConfig = Field(default_factory=EventsConfig)
