"""``gateway.yaml`` (or an ``mcpServers`` JSON file): models, interpolation, load and validate once.

Every problem is reported as one ``ConfigError`` whose message names the file, the field
path (``upstreams.search.timeout``) and the reason. Nothing below ``cli``/``server`` reads
the environment: the caller passes it in.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from agent_gateway.config_agent import AgentConfig, ModelConfig
from agent_gateway.config_auth import AuthConfig, ClientPolicy, JwtConfig, RateLimit, StaticToken
from agent_gateway.config_base import EnvName, FieldProblem, Seconds, scheme_of
from agent_gateway.config_base import Strict as _Strict
from agent_gateway.config_connections import ConnectionsConfig
from agent_gateway.config_store import EventsConfig, MemoryConfig, StoreConfig
from agent_gateway.naming import DEFAULT_SEPARATOR, upstream_name_problem

__all__ = [  # the agent, auth, connections, store and memory models and FieldProblem are re-exported: callers import them from here
    "AgentConfig",
    "AuthConfig",
    "ClientPolicy",
    "ConnectionsConfig",
    "EventsConfig",
    "FieldProblem",
    "JwtConfig",
    "MemoryConfig",
    "ModelConfig",
    "RateLimit",
    "StaticToken",
    "StoreConfig",
]

Transport = Literal["stdio", "streamable-http", "sse", "websocket"]
ProtocolMode = Literal["auto", "legacy", "2026-07-28"]


class HealthConfig(_Strict):
    """Pings that find an upstream which stopped answering while its connection looks open."""

    interval: Seconds | None = 30.0
    """Seconds between pings on the shared connection; None: none on a timer (one is still sent
    when a call times out with nothing else heard)."""
    timeout: Seconds = 10.0
    """A ping not answered within this marks the upstream down (and fails its pending calls)."""


class RetryConfig(_Strict):
    """Reconnecting to a down upstream: exponential backoff with jitter."""

    initial_delay: Seconds = 0.5
    max_delay: Seconds = 30.0


class BreakerConfig(_Strict):
    """The circuit breaker: stop sending calls to an upstream whose calls keep failing."""

    failures: int = Field(default=5, ge=1, le=1000)
    """Consecutive failed calls (connection lost, timed out) that open the circuit."""
    reset: Seconds = 30.0
    """Seconds the circuit stays open before one probe call is let through (half-open)."""


class UpstreamConfig(_Strict):
    """One upstream MCP server, in the shape clients already use in ``mcpServers``."""

    command: str | None = None
    args: tuple[str, ...] = ()
    # repr=False: values here are often secrets and must never reach a log line.
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    env_passthrough: tuple[EnvName, ...] = ()
    """More of the gateway's own environment for this stdio upstream (names or globs), on top
    of the default: the SDK's safe variables, proxy and CA settings, ``npm_config_*``."""
    cwd: str | None = None
    url: str | None = None
    transport: Transport | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    protocol: ProtocolMode = "auto"
    timeout: Seconds = 30.0
    connect_timeout: Seconds = 60.0
    prefix: bool = True
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    rename: dict[str, Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = Field(default_factory=dict)
    """A tool's name as listed (before its prefix): a public name's characters, 1-64 of them."""
    session: Literal["shared", "per_client"] = "shared"
    """``shared``: one multiplexed upstream session; ``per_client``: one per downstream session."""
    max_sessions: int = Field(default=32, ge=1, le=10_000)
    """With ``session: per_client``: its sessions open at once (for stdio, processes). A new
    one past it, or past its client's share, takes the place of an idle one (see
    ``upstreams/dedicated.py``), or is refused."""
    max_sessions_per_client: int | None = Field(default=None, ge=1, le=10_000)
    """One client's share of ``max_sessions``; None: a quarter of them, at least one (with a
    single client, one token, set it to ``max_sessions``)."""
    enabled: bool = True
    health: HealthConfig = Field(default_factory=HealthConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    breaker: BreakerConfig | None = Field(default_factory=BreakerConfig)
    """None: no circuit breaker."""
    failure_mode: Literal["fail_open", "hide"] = "fail_open"
    """While the upstream is down: ``fail_open`` keeps its tools listed (calls fail at once
    with a clear error); ``hide`` takes them out of the catalog until it is back."""
    max_concurrency: int | None = Field(default=200, ge=1, le=100_000)
    """Calls in flight to this upstream at once (all clients together). One more is refused
    at once when its client holds calls there, else it waits for the next slot. While its shared
    session's pings say it has calls queued, fewer are sent at once and the others wait their
    turn (``upstreams/queueing.py``). Below the HTTP
    connection pool, which keeps connections beyond it for health checks and list refreshes;
    None: no bound."""
    max_concurrency_per_client: int | None = Field(default=None, ge=1, le=100_000)
    """One client's share of ``max_concurrency`` (an ``ask_agent`` run's calls are its
    client's); one more is refused at once. None: as many as it leaves free, so one client
    alone takes at most half the slots, a second half the rest, and a client with fewer calls
    in flight finds one. A gateway with one client sets it to ``max_concurrency``."""
    max_message_bytes: int = Field(default=128 * 2**20, ge=1024, le=2**31)
    """The largest message accepted from this upstream, on any transport. Over it, the call it
    answers fails at once saying so (over HTTP and SSE, read no further); on WebSocket the
    connection closes."""
    notification_rate: int | None = Field(default=1000, ge=1, le=1_000_000)
    """Notifications and requests one session of this upstream may send unasked a second (a
    second's worth at once); past it the gateway reads the upstream more slowly, dropping
    nothing (``upstreams/pace.py``). None: no bound."""
    tool_timeouts: dict[str, Seconds] = Field(default_factory=dict)
    """Per-tool timeouts: globs over the upstream's own tool names; the first match wins
    over ``timeout``."""
    search_weight: float = Field(default=1.0, ge=0.0, le=1.0)
    """What tool search makes of this upstream's matches (0: never found; still callable)."""

    @model_validator(mode="after")
    def _one_target(self) -> UpstreamConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of 'command' (stdio) or 'url' (remote)")
        if self.command is not None and self.transport not in (None, "stdio"):
            raise ValueError(f"transport {self.transport!r} needs a 'url', not a 'command'")
        if self.url is not None and self.transport == "stdio":
            raise ValueError("transport 'stdio' needs a 'command', not a 'url'")
        if self.url is not None and self.transport is not None and self.transport != "stdio":
            websocket_url = self.url.startswith(("ws://", "wss://"))
            if websocket_url != (self.transport == "websocket"):
                wanted = "a ws:// or wss://" if self.transport == "websocket" else "an http:// or https://"
                raise ValueError(
                    f"transport {self.transport!r} needs {wanted} url, not {scheme_of(self.url)}"
                )
        if self.url is not None and not re.match(r"^(https?|wss?)://", self.url):
            raise ValueError(
                f"url must start with http://, https://, ws:// or wss://, not {scheme_of(self.url)}"
            )
        if self.retry.initial_delay > self.retry.max_delay:
            raise ValueError("retry.initial_delay must not exceed retry.max_delay")
        return self

    def timeout_of(self, tool: str) -> float:
        """The timeout for one call of the upstream's tool ``tool``."""
        for pattern, seconds in self.tool_timeouts.items():
            if fnmatch.fnmatchcase(tool, pattern):
                return seconds
        return self.timeout

    @property
    def kind(self) -> Transport:
        """The transport in effect: stdio for a command; for a url, websocket when it is
        ws:// or wss://, streamable-http otherwise, unless ``transport`` says."""
        if self.command is not None:
            return "stdio"
        if self.transport is not None:
            return self.transport
        assert self.url is not None
        return "websocket" if self.url.startswith(("ws://", "wss://")) else "streamable-http"


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServerConfig(_Strict):
    """How the gateway itself is served."""

    name: str = "agent-gateway"
    transport: Literal["stdio", "http"] = "http"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65_535)
    path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9_./-]*$")
    separator: str = Field(default=DEFAULT_SEPARATOR, pattern=r"^[A-Za-z0-9_-]{1,3}$")
    instructions: str | None = None
    session_idle_timeout: Seconds = 1800.0
    """An HTTP session with no request for this long is ended (and what it held released); an
    authenticated modern client's dedicated upstream session unused this long is closed."""
    startup_wait: Seconds | None = None
    """Seconds start-up waits for the upstreams before the gateway serves; None: until each
    has connected or failed once (the largest ``connect_timeout``). One still connecting then
    joins the catalog when it connects, and clients are told the list changed."""
    drain_timeout: int = Field(default=30, ge=1, le=3600)
    """On SIGTERM: seconds the calls in flight have to finish before they are cut off (new
    connections are refused at once, and notification streams closed so clients reconnect
    to another replica)."""
    stdio_drain: Seconds = 5.0
    """stdio: seconds from the end of the client's input (it closed stdin) until the gateway
    stops, for the requests in flight to be answered (four fifths of it; those left are then
    answered ``-32000 Connection closed``) and the answers to reach stdout."""
    allowed_hosts: tuple[str, ...] = ()
    """Host header values accepted besides loopback names and the bound address (DNS-rebinding
    protection); globs, ``*`` turns the check off."""
    allowed_origins: tuple[str, ...] = ()
    """Browser Origins accepted besides the server's own."""
    max_body_bytes: int = Field(default=4 * 2**20, ge=1024, le=4 * 2**20)
    """The largest HTTP request body accepted; a bigger one gets 413 and a JSON-RPC error.
    At most 4 MiB: the mcp SDK's Streamable HTTP transport refuses more (with a bare 413),
    and FastMCP offers no way to raise its limit."""
    max_body_elements: int = Field(default=100_000, ge=100, le=10_000_000)
    """JSON values (objects, arrays, list items) one request body may hold: parsing runs on
    the event loop, where a million of them would stall every client for a second."""
    max_bytes_in_flight: int = Field(default=256 * 2**20, ge=2**20)
    """Bytes of upstream answers the process may hold at once, from their read until written
    to the client; an answer that would pass it fails with "retry shortly" (``in_flight``)."""
    max_listen_streams: int = Field(default=1024, ge=1, le=100_000)
    """Modern-era ``subscriptions/listen`` streams open at once. At the bound a client's new
    stream ends the oldest of the client holding the most (when it holds two more than the
    newcomer's client), else it is refused: a few clients cannot keep everyone else out."""
    max_sessions: int = Field(default=1000, ge=1, le=10_000)
    """Handshake-era HTTP sessions this replica holds (each kept until its idle timeout). At
    the bound a new one ends the session idle the longest of the client holding the most
    (``downstream/room.py``), else it is refused with 503: many clients (an anonymous one
    per address) cannot fill it for everyone. At most the SDK's own bound, 10,000."""
    connections: ConnectionsConfig = Field(default_factory=ConnectionsConfig)
    page_size: int = Field(default=100, ge=1, le=10_000)
    """Items per page of ``tools/list`` (and the other lists): a longer list is paginated with
    ``nextCursor``. 100, as ``search.threshold``: a client listed more is usually searching."""
    public_health: Literal["full", "minimal"] | None = None
    """``minimal``: ``/readyz`` answers only whether the gateway is ready, and ``/metrics``
    (tool and upstream names) needs an admin client, like ``/status``. None: ``minimal``
    when auth is on, ``full`` when it is not (``http.public_health``)."""
    ui: bool = True
    """Serve the status page at ``GET /`` (HTTP; behind the same auth as ``/status``)."""
    page_bytes_per_second: int = Field(default=2**20, ge=2**10, le=2**40)
    """Bytes of the status page, ``/status`` and ``/metrics`` one client is sent a second, on
    average, and ``PAGE_BURST`` seconds of it at once (``page_budget.py``): each answer is bytes
    the event loop writes, and a client polling a 10,000-tool page (18 MB) flat out held every
    other client's calls."""
    state_keys: tuple[Annotated[str, Field(min_length=32)], ...] = Field(default=(), repr=False)
    """Secrets (32+ characters) sealing the ``requestState`` of a paused multi-round call: the
    first seals, every one unseals (rotation). None: a random key per process, so a paused
    call cannot be resumed after a restart or on another replica."""


class EmbeddingsConfig(_Strict):
    """An OpenAI-compatible ``/embeddings`` endpoint: dense retrieval fused with the lexical ranking."""

    base_url: str = Field(pattern=r"^https?://")
    model: str = Field(min_length=1)
    api_key: str | None = Field(default=None, repr=False)
    timeout: Seconds = 30.0
    batch: int = Field(default=256, ge=1, le=4096)
    """Tool texts sent per request while the catalog is embedded."""
    query_prefix: str = Field(default="", max_length=200)
    """Written before each request, for models trained with one (e5: ``"query: "``)."""
    document_prefix: str = Field(default="", max_length=200)
    """Written before each tool's text (e5: ``"passage: "``)."""


class SearchConfig(_Strict):
    """Tool search: ``search_tools`` and ``call_tool`` in place of a long tool list."""

    mode: Literal["off", "auto", "on"] = "auto"
    """``auto``: search mode for a client that may see more than ``threshold`` tools."""
    threshold: int = Field(default=100, ge=0, le=1_000_000)
    pinned: tuple[str, ...] = ()
    """Tools (globs over public names) listed in full next to the search tools."""
    limit: int = Field(default=10, ge=1, le=50)
    """Results per search when the caller asks for no number."""
    embeddings: EmbeddingsConfig | None = None
    """None: lexical retrieval only."""


class TelemetryConfig(_Strict):
    """OpenTelemetry: where traces and metrics go. The standard ``OTEL_*`` variables win."""

    service_name: str = "agent-gateway"
    otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://")
    """The collector's OTLP/HTTP base URL (``/v1/traces`` is appended). None: no export."""
    otlp_headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Sent with every export (often a token): never logged."""
    sampling_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of new traces recorded; a sampled caller's trace is always continued."""
    metrics: bool = True
    """Serve ``/metrics`` (HTTP transport), and export metrics over OTLP when it is set."""
    log_format: Literal["text", "json"] = "text"


class AuditConfig(_Strict):
    """The audit trail: one hash-chained JSONL record per call and agent run."""

    enabled: bool = True
    path: str = ".agent-gateway/audit.jsonl"
    """One file per gateway process (two writers would interleave their chains)."""
    arguments: Literal["digest", "full"] = "digest"
    """``digest``: a SHA-256 of each call's arguments; ``full``: the arguments themselves too."""
    max_bytes: int = Field(default=50 * 2**20, ge=4096)
    """The file is rotated (``.1``, ``.2`` …) once it passes this size; the chain continues."""
    keep: int = Field(default=5, ge=1, le=1000)
    """Rotated files kept."""
    queue: int = Field(default=10_000, ge=16, le=1_000_000)
    """Records waiting for the writer; past it records are dropped (counted), calls never wait."""
    required: bool = False  # calls refused while the trail cannot be written (a full disk): none unaudited


class GatewayConfig(_Strict):
    """The whole validated configuration."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    upstreams: dict[str, UpstreamConfig] = Field(default_factory=dict)
    env_passthrough: tuple[EnvName, ...] = ()
    """``env_passthrough`` for every stdio upstream."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    store: StoreConfig | None = None
    """None: everything in this process (one replica)."""
    pinning: Literal["hold", "warn", "off"] = "hold"
    """A pinned tool whose definition changed: withheld until accepted (``hold``), served with
    a warning (``warn``), or not checked (``off``)."""

    @model_validator(mode="after")
    def _secured(self) -> GatewayConfig:
        server, auth = self.server, self.auth
        exposed = server.transport == "http" and server.host not in _LOOPBACK
        if exposed and auth.mode == "none" and not auth.allow_unauthenticated:
            raise FieldProblem(
                ("auth", "mode"),
                f"server.host {server.host!r} is not loopback and auth is 'none': set auth.mode "
                "(bearer or jwt), or auth.allow_unauthenticated: true if something else guards it",
            )
        return self

    @model_validator(mode="after")
    def _upstream_names(self) -> GatewayConfig:
        for name in self.upstreams:
            if (problem := upstream_name_problem(name, self.server.separator)) is not None:
                raise FieldProblem(("upstreams", name), f"upstream name {name!r} {problem}")
        return self

    @property
    def active_upstreams(self) -> dict[str, UpstreamConfig]:
        """Upstreams that are not switched off with ``enabled: false``."""
        return {name: up for name, up in self.upstreams.items() if up.enabled}
