"""The gateway's one exception tree and its single mapping to MCP error codes.

    GatewayError
    ├── ConfigError            bad gateway.yaml / mcpServers file (names file, field, reason)
    ├── CannotServe            the gateway cannot listen where it was told to (port taken, …)
    │   └── StoreUnavailable   the shared store (Redis) or database (Postgres) does not answer
    ├── CommandNotFound        a stdio upstream's command is not there (named in the message)
    ├── UnknownName            a tool, prompt or resource the catalog does not have
    │   ├── ToolHeld           a pinned tool that changed, withheld until an operator accepts it
    │   └── UnmatchedURI       a resource URI too costly to match against the templates
    ├── InvalidArguments       tool arguments that fail the tool's inputSchema
    ├── InvalidRequest         a request taken as it is by nothing (an over-long name, a cursor not ours)
    ├── NotAllowed             a name outside the calling client's policy (never forwarded)
    ├── UnknownRound           a retry naming a held call that is not held for it
    ├── ReplicaError           another replica's error serving a held call's round
    ├── ClientLimited          the calling client is over its own limit (never forwarded)
    ├── RateLimited            the calling client is over its rate or its sessions: 429, retried later
    ├── GatewayBusy            past a bound of the process's: bytes in flight, sessions (retried later)
    │   ├── KeysUnavailable    the identity provider's keys cannot be fetched: a token not checkable now
    │   └── AuditUnwritable    ``audit.required`` and the trail cannot be written now
    ├── DrainEnded             SIGTERM: the call still ran when ``server.drain_timeout`` was up
    ├── TokenWithdrawn         a reload rotated or took out the token the request came with
    └── UpstreamError          anything that went wrong talking to one upstream
        ├── UpstreamUnavailable    not connected, or the connection died mid-call
        │   └── CircuitOpen        not sent: the upstream's calls keep failing (breaker open)
        ├── UpstreamBusy           not sent: the upstream's max_concurrency is reached
        ├── UpstreamTimeout        no answer within the upstream's timeout
        └── UpstreamRejected       the upstream's answer was an error, or not one to pass on
            └── UpstreamAnswered   the upstream's own JSON-RPC error, relayed with its code and data
    └── AgentError             an ``ask_agent`` run that could not produce an answer
        ├── ModelUnavailable       no model configured and the client offers no sampling
        ├── ModelFailed            the model call raised (provider error, refused sampling)
        ├── BadModelOutput         the model's answer could not be understood after re-prompts
        └── StepLimitReached       the model still wanted tools after ``agent.max_steps`` turns

Foreign errors are translated into this tree at two boundaries: mcp's ``MCPError`` and
transport errors in ``upstreams.session`` (``UpstreamSession.translated``); model providers'
errors in ``agent.graph`` (the model node). Every error a client receives as a JSON-RPC error leaves through ``to_wire``
(whichever method met it, a timeout is -32001); a tool's failure is instead an ``isError``
result the model can read, and an agent run turns ``AgentError`` into one too (but an
upstream's -32042 to a tool call, "URL elicitation required", is relayed as it came).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    code: int = types.INTERNAL_ERROR
    data: Any = None
    """What a client is told beside the message (the JSON-RPC error's ``data``: any JSON value,
    an upstream's own passed on as it sent it)."""


class ConfigError(GatewayError):
    """The configuration file is invalid; the message names file, field path and reason."""

    code = types.INVALID_PARAMS


class CannotServe(GatewayError):
    """The gateway cannot serve where it was told to (its address taken, not allowed, unknown)."""


class StoreUnavailable(CannotServe):
    """The shared store (Redis) or the shared database (Postgres) cannot be reached."""


class CommandNotFound(GatewayError):
    """A stdio upstream's command does not exist or cannot be run; the message names it."""


class UnknownName(GatewayError):
    """A public name (tool, prompt, resource URI) that the catalog does not hold."""

    code = types.INVALID_PARAMS

    def __init__(self, kind: str, name: str) -> None:
        if kind == "resource":  # SEP-2164's words, the URI whole in data, as FastMCP and the SDK say it
            super().__init__(f"Resource not found: {shown(name)}")
            self.data = {"uri": name}
        else:
            super().__init__(f"Unknown {kind}: {shown(name)}")
        self.kind, self.name = kind, name


class UnmatchedURI(UnknownName):
    """A resource URI whose match against the templates was given up: past the characters its
    matchers may scan (``catalog_resources.READ_SCAN``)."""

    def __init__(self, uri: str, scanned: int) -> None:
        super().__init__("resource", uri)
        self.args = (
            f"{self.args[0]} (given up matching its {len(uri)} characters against the resource "
            f"templates after {scanned} characters scanned)",
        )


class ToolHeld(UnknownName):
    """A pinned tool whose definition changed: withheld until an operator accepts it."""

    def __init__(self, name: str, changed: str) -> None:
        super().__init__("tool", name)
        self.args = (
            f"tool {name!r} is held for review: its upstream changed its {changed} since it was "
            f"pinned; an operator must accept it (agent-gateway pins accept {name})",
        )


class InvalidArguments(GatewayError):
    """Arguments rejected against the tool's inputSchema before leaving the gateway."""

    code = types.INVALID_PARAMS

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"Invalid arguments for tool {tool!r}: {reason}")
        self.tool = tool
        self.reason = reason


class InvalidRequest(GatewayError):
    """A request the gateway cannot take as it is: a name or URI longer than any it serves,
    a cursor it never issued, a subscription outside a session, a body it cannot read."""

    code = types.INVALID_PARAMS

    def __init__(self, message: str, code: int = types.INVALID_PARAMS) -> None:
        super().__init__(message)
        self.code = code


RATE_LIMITED = -32029
"""The JSON-RPC code of a request refused by its client's rate or sessions limit (-32000 to
-32099 are the implementation's own)."""


class RateLimited(GatewayError):
    """The calling client is over its rate limit, or holds its ``max_sessions``: answered
    429 (over HTTP) with ``retryAfterSeconds`` when a retry then would be served."""

    code = RATE_LIMITED

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None:
            self.data = {"retryAfterSeconds": round(retry_after, 1)}

    @classmethod
    def retry_in(cls, subject: str, wait: float) -> RateLimited:
        """Client ``subject`` over its rate limit: its next token comes in ``wait`` seconds."""
        return cls(f"rate limit exceeded for client {subject!r}: retry in {wait:.1f}s", retry_after=wait)


class NotAllowed(GatewayError):
    """A tool, prompt or resource outside the calling client's policy: never forwarded."""

    code = types.INVALID_PARAMS

    def __init__(self, kind: str, name: str, client: str) -> None:
        super().__init__(f"{kind} {name!r} is not allowed for client {client!r}")
        self.kind, self.name = kind, name


class UnknownRound(GatewayError):
    """A modern client's retry naming a held call (``downstream.held_calls``) that is not held
    here for it: ended, given up, another client's or tool's, or held by another replica."""

    code = types.INVALID_PARAMS

    def __init__(self, tool: str) -> None:
        super().__init__(
            f"the call of {tool!r} this requestState names is not held here: it ended, "
            "its answers came too late, or the replica holding it is gone; call the tool again"
        )


class ReplicaError(GatewayError):
    """The error another replica met serving a held call's round (``store.rounds``), passed on."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientLimited(GatewayError):
    """The calling client is over its own limit (concurrent calls): never forwarded."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"client limit: {reason}")


class GatewayBusy(GatewayError):
    """The process holds its bound: of bytes in flight (``server.max_bytes_in_flight``: an
    upstream's answer not relayed, a body not read), or of sessions (``server.max_sessions``,
    none idle: a new one not opened). Transient: retried later, it is served."""


class KeysUnavailable(GatewayBusy):
    """A JWT names a key the gateway cannot get now: the identity provider's JWKS cannot be
    fetched. Not the token's fault (a 401 would have its client throw it away): answered
    503, retried later."""


class AuditUnwritable(GatewayBusy):
    """``audit.required``: the audit trail cannot be written now, so a call is refused rather
    than served unaudited. Transient: once it can be written again, calls are served."""


class DrainEnded(GatewayError):
    """The gateway is stopping (SIGTERM) and the call was still running when its drain ended."""


class TokenWithdrawn(GatewayError):
    """A reload rotated (its name kept with another secret) or took out the static token a
    request came with while the request ran: the request is ended."""

    code = types.INVALID_REQUEST


class UpstreamError(GatewayError):
    """A failure attributable to one upstream; the message always names it."""

    def __init__(self, upstream: str, message: str, *, what: str | None = None) -> None:
        detail = message if what is None else f"{what}: {message}"
        super().__init__(f"upstream {upstream!r}: {detail}")
        self.upstream = upstream
        self.detail = detail
        # Without ``what`` (the request that met it: a tool's name, a client's session): what
        # any client may be told of the failure (the circuit's refusals, ``/readyz``).
        self.cause = message


class UpstreamUnavailable(UpstreamError):
    """The upstream is not connected, or its connection closed while the call waited."""


class SessionGivenUp(UpstreamUnavailable):
    """A client's dedicated session stopped answering its own health check and was closed."""


class CircuitOpen(UpstreamUnavailable):
    """Not sent: the upstream's recent calls kept failing, so its circuit breaker is open."""


class UpstreamBusy(UpstreamError):
    """Not sent: the upstream already has its ``max_concurrency`` calls in flight."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer within its configured timeout."""

    code = types.REQUEST_TIMEOUT


class UpstreamRejected(UpstreamError):
    """The upstream's answer was an error, or not an answer the gateway can pass on; its code
    is kept."""

    def __init__(self, upstream: str, message: str, code: int) -> None:
        super().__init__(upstream, message)
        self.code = code


class UpstreamAnswered(UpstreamRejected):
    """The upstream answered with a JSON-RPC error of its own: the client gets its code and
    ``data`` as the upstream sent them (a tool call's is an ``isError`` result, but for URL
    elicitation's -32042, whose data holds the URLs the client must open)."""

    def __init__(self, upstream: str, message: str, code: int, data: Any) -> None:
        super().__init__(upstream, message, code)
        self.data = data


class AgentError(GatewayError):
    """An ``ask_agent`` run ended without an answer; the client gets it as an ``isError`` result."""


class ModelUnavailable(AgentError):
    """No model is configured and the calling client cannot lend its own through sampling."""


class ModelFailed(AgentError):
    """The model call failed: the provider's error, or the client's refusal to sample."""


class BadModelOutput(AgentError):
    """The model kept answering in a form the agent cannot use (after its re-prompts)."""


class StepLimitReached(AgentError):
    """The model asked for more tool calls after the configured number of steps."""


REFUSALS = (NotAllowed, ClientLimited, UpstreamBusy, ToolHeld, GatewayBusy)
"""The failures that are refusals by a bound or a policy, not errors: recorded ``refused``."""


def to_wire(exc: GatewayError) -> MCPError:
    """The JSON-RPC error a client receives for ``exc`` (raise it ``from exc``): the one
    place the tree meets the wire, so every method answers the same failure alike."""
    return MCPError(code=exc.code, message=str(exc), data=exc.data)


KNOWN_CODES = frozenset(
    value for name, value in vars(types).items() if name.isupper() and type(value) is int and value < 0
) | {RATE_LIMITED, -32002}  # a handshake-era resource not found
"""The JSON-RPC error codes of the spec, MCP and the gateway (rate limited; resource not found
as handshake-era servers answer it): the ones a metric label may name."""


def error_type_of(code: int) -> str:
    """A JSON-RPC error's ``error.type``: its code if it is a known one, else ``_OTHER`` (an
    upstream chooses its codes, and each would be a metric series of its own)."""
    return str(code) if code in KNOWN_CODES else "_OTHER"


def describe(exc: BaseException) -> str:
    """A one-line, secret-free description of a failure (groups unwrapped)."""
    exc = lone(exc)
    if isinstance(exc, BaseExceptionGroup):
        # A transport's group often holds the same failure several times over.
        parts = dict.fromkeys(text for e in exc.exceptions if (text := describe(e).rstrip(": ")))
        return "; ".join(parts)
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, MCPError):
        return exc.error.message
    if isinstance(exc, httpx2.HTTPError):
        # The request URL may carry credentials; name the kind of failure only.
        return f"{type(exc).__name__}: {str(exc).split(' for url ')[0].split(', url=')[0]}"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, UpstreamUnavailable | CommandNotFound) else f"{type(exc).__name__}: {text}"


def lone(exc: BaseException) -> BaseException:
    """``exc``, or the one failure its task groups hold (however deep)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


SHOWN = 80
"""The most characters of a client's value an error or answer repeats."""


def shown(value: str) -> str:
    """``value`` as an error or answer repeats it: quoted, at most ``SHOWN`` characters of it,
    and its length when it was cut (what a client sent never comes back whole)."""
    if len(value) <= SHOWN:
        return repr(value)
    return f"{value[:SHOWN]!r}... ({len(value)} characters)"


WIRE_CODES = range(-(2**31), 2**31)
"""Error codes passed on as they are. JSON-RPC's code is any integer, but clients read it into
a 32-bit field (Rust's, Go's int32s) or a JavaScript number: one answer's code of 10**30 failed
such a client's parse of the whole message. A code past it is passed on as -32603."""


def wire_code(code: int) -> tuple[int, str]:
    """``code`` as it is passed on, and what to add to its message when it is not."""
    if code in WIRE_CODES:
        return code, ""
    return types.INTERNAL_ERROR, f" (its error code, {len(str(abs(code)))} digits, is past what clients read)"


MAX_ERROR_CHARS = 1000
"""Characters of a client's error answer to a question (sampling, elicitation, roots) passed
on to whoever asked, an upstream or an agent run (its ``data`` only when that short too). A
client answered with a 1 MB message: an upstream shared by every client spent its CPU logging
it until its health check failed, and an agent run sent it whole to its model and kept it."""


def cut_client_error(error: types.ErrorData) -> types.ErrorData:
    """A client's error answer as it is passed on: cut to ``MAX_ERROR_CHARS``, saying how long
    it was, its ``data`` dropped when longer."""
    message = error.message
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}… ({len(message)} characters)"
    data = error.data if len(json.dumps(error.data, default=str)) <= MAX_ERROR_CHARS else None
    code, said = wire_code(error.code)
    if message is error.message and data is error.data and not said:
        return error
    return types.ErrorData(code=code, message=message + said, data=data)
