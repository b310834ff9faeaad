"""``store:``: the state several replicas share (Redis; absent, each replica keeps its own), and
``agent.memory``: where conversations are kept."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agent_gateway.config_base import FieldProblem, Seconds
from agent_gateway.config_base import Strict as _Strict


class EventsConfig(_Strict):
    """What a dropped SSE stream can get back (``Last-Event-ID``), kept in the shared store."""

    ttl: Seconds = 300.0
    """An event older than this is gone; a client reconnecting later starts afresh."""
    per_stream: int = Field(default=1000, ge=1, le=1_000_000)
    """Events kept per stream (the newest)."""
    max_event_bytes: int = Field(default=2**20, ge=1024)
    """A larger event (a large answer) is not kept: a client whose stream drops before it
    arrives asks again. Every event is in Redis for ``ttl``: one client's large answers held
    gigabytes there."""
    per_client: int = Field(default=32 * 2**20, ge=2**20)
    """Bytes of one client's events a replica writes within ``ttl`` (a budget refilled over
    it, so at most twice this is held): past it, its events are not kept. Unbounded, one client
    streaming large answers put 176 MB a replica in Redis every 10 s, for ``ttl`` each."""
    max_replay_bytes: int = Field(default=4 * 2**20, ge=1024)
    """A resume that would replay more is refused (the client starts its request again):
    a replay is read whole, and held once per resume."""


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


class MemoryConfig(_Strict):
    """Where conversations are kept: a SQLite file (survives restarts), this process only, or a
    Postgres database that every replica shares."""

    store: Literal["sqlite", "memory", "postgres"] = "sqlite"
    path: str = ".agent-gateway/conversations.sqlite"
    url: str | None = Field(default=None, pattern=r"^postgres(ql)?://", repr=False)
    """``store: postgres``: the database (``postgresql://user:password@host/db``); never logged."""
    retention_days: float | None = Field(default=30.0, gt=0)
    """A thread no run has used for this long is deleted; None keeps threads for ever."""
    max_threads: int | None = Field(default=100, ge=1)
    """Threads one client (anonymous: one address) keeps; past it its least recently used go."""

    @model_validator(mode="after")
    def _located(self) -> MemoryConfig:
        if self.store == "postgres" and self.url is None:
            raise FieldProblem(
                ("agent", "memory", "url"), "store 'postgres' needs url: postgresql://user:password@host/db"
            )
        return self
