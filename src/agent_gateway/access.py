"""Who a request comes from and what that client may do: authentication on HTTP, each
client's policy (allowed names, rate limit, concurrent calls), enforced before anything is
forwarded.

Token checking is FastMCP's (its bearer middleware answers 401 with the
``WWW-Authenticate`` challenge, ``JWTVerifier`` checks signature, expiry, issuer and
audience against a JWKS URL or a secret, ``RemoteAuthProvider`` serves the OAuth
protected-resource metadata). Static tokens are kept as SHA-256 digests only (``authentication.py``). The
request's client (a ``Principal``) is identified from the request's own token
(``AccessControl.identify``): by the request wrapper, which binds it for listings (``bound``),
and by the pipeline, which carries it on the call's ``Caller``, so the proxy (and the agent's
tool calls, which go through it) check the identity on the call, never an ambient one.

The client's own credentials stop here: upstream connections carry only the headers and
environment configured for each upstream.
"""

from __future__ import annotations

import contextvars
import fnmatch
import functools
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastmcp.server.auth import AccessToken
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext

from agent_gateway.addresses import client_key
from agent_gateway.agent_spend import AgentSpend, spend_of
from agent_gateway.authentication import StaticAccessToken
from agent_gateway.config import AuthConfig, ClientPolicy
from agent_gateway.errors import ClientLimited, InvalidRequest, NotAllowed, RateLimited, to_wire
from agent_gateway.logs import POLICY_REFUSED, clipped
from agent_gateway.naming import MAX_NAME_LENGTH
from agent_gateway.refusals import refused
from agent_gateway.token_bucket import Clock, TokenBucket
from agent_gateway.turns import Turns

logger = logging.getLogger(__name__)

Kind = Literal["tool", "prompt", "resource"]

ANONYMOUS = "anonymous"
_UNMETERED = frozenset({"initialize", "notifications/initialized", "server/discover", "ping"})


@dataclass(eq=False)
class Principal:
    """One client as the policy sees it: its name, its policy and its running counts."""

    subject: str
    policy_name: str
    policy: ClientPolicy
    bucket: TokenBucket | None = None
    authenticated: bool = False
    """Named by a verified token (else the anonymous client of an unauthenticated gateway)."""
    in_flight: int = 0
    held: int = 0
    """Bytes of its answers the gateway holds until they are written (``in_flight.hold``)."""
    sessions: int = 0
    """Sessions open now (kept by the session registry)."""
    opening: int = 0
    """Requests without a session id being served now: each opens one (HTTP admission)."""
    spent: AgentSpend = field(default_factory=lambda: AgentSpend(None, None))
    turns: Turns | None = field(default=None, repr=False)
    """Its large bodies' turns to be parsed and served (``turns.py``), made at its first."""
    label: str = ""
    """How log lines name it: its subject, and an anonymous client's address with it."""
    static: bool = False
    """Named by a static token (``auth.tokens``): a reload reads its policy from there."""
    revision: int = 0
    """The revision of ``auth`` its policy was read from (``AccessControl.reconfigure``)."""

    def __post_init__(self) -> None:
        self.label = self.label or self.subject

    @property
    def policy_key(self) -> str:
        """What a cache of a policy's view is keyed by: its name alone would serve a policy
        changed by a reload from what was worked out for the old one."""
        return f"{self.revision}:{self.policy_name}"

    def allows(self, kind: Kind, name: str) -> bool:
        """Whether the policy lets this client reach the public ``name`` of ``kind``."""
        patterns = {"tool": self.policy.tools, "prompt": self.policy.prompts}.get(kind, self.policy.resources)
        if patterns == ("*",):  # everything: no glob to match, nothing to cache
            return True
        if len(name) > _CACHED_NAME:  # a long URI, chosen by its client: not kept
            return _matches(patterns, kind == "resource", name)
        return _allowed(patterns, kind == "resource", name)

    def tool_filter(self) -> Callable[[str], bool] | None:
        """Which tools this client may call, as a filter over public names; None when its
        policy allows every tool (nothing to filter: callers skip the pass)."""
        if self.policy.tools == ("*",):
            return None
        return lambda name: self.allows("tool", name)

    def check(self, kind: Kind, name: str) -> None:
        """Raises ``NotAllowed`` when the policy does not let this client reach ``name``."""
        if not self.allows(kind, name):
            logger.warning(
                POLICY_REFUSED, self.label, kind, name, self.policy_name, extra={"peer": self.label}
            )
            raise NotAllowed(kind, name, self.subject)

    @contextmanager
    def calling(self) -> Iterator[None]:
        """One call in flight (a tool call, a prompt render, a resource read, a completion),
        refused at once over the policy's ``max_concurrency``. Inside an agent run (``running_agent``) the run already holds the client's slot."""
        if _IN_RUN.get():
            yield
            return
        limit = self.policy.max_concurrency
        if limit is not None and self.in_flight >= limit:
            refused(
                "concurrency", "client %s over its max_concurrency (%d)", self.label, limit, peer=self.label
            )
            raise ClientLimited(
                f"{self.in_flight} calls already in flight, the limit (max_concurrency) is {limit}"
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @contextmanager
    def running_agent(self, *, resuming: bool = False) -> Iterator[None]:
        """One ``ask_agent`` run: a call in flight for this client, within its agent budget;
        the run's own tool calls go in its slot (its model calls one tool at a time or
        several, but it is one thing the client asked for). ``resuming``: the call carries a
        paused run's ``requestState``, the same run's next round, charged once already (a
        state the run did not issue resumes nothing: the runner refuses it)."""
        with self.calling():
            if not resuming:
                self.spent.start(self.label)
            token = _IN_RUN.set(True)
            try:
                yield
            finally:
                _IN_RUN.reset(token)


_IN_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("agent_gateway_in_run", default=False)


_CACHED = 65_536
"""Names whose answer ``_allowed`` keeps, for all clients: each policy's globs against the catalog's
names. Kept per client, 4,096 of them, a 10,000-tool search under 30 globs matched every row again."""
_CACHED_NAME = 256
"""Longer names are matched each time, not kept: 65,536 resource URIs of 8 KiB held 525 MiB."""
_CLIENTS = 10_000
REVOKED = "(revoked)"  # a token a reload removed: its open streams, no request re-checks, get nothing
_REVOKED = ClientPolicy(tools=(), prompts=(), resources=())


def _matches(patterns: tuple[str, ...], resource: bool, name: str) -> bool:
    """Whether ``name`` matches one of ``patterns`` (a policy's globs for one kind)."""
    known = any(fnmatch.fnmatchcase(name, p) for p in patterns)
    return known and not (resource and _climbs(name))  # file:///docs/../etc matches file:///docs/*


_allowed = functools.lru_cache(maxsize=_CACHED)(_matches)
"""``_matches``, kept for every client whose policy has the same globs."""


def _climbs(uri: str) -> bool:
    """Whether a URI has dot segments (also percent-encoded), which could lead out of the
    prefix a resource glob allows."""
    path = urllib.parse.unquote(uri.partition("?")[0]).replace("\\", "/")
    return any(segment in (".", "..") for segment in path.split("/"))


_CURRENT: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "agent_gateway_principal", default=None
)


_ADMITTED: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "agent_gateway_admitted", default=None
)


@contextmanager
def admitting(client: Principal) -> Iterator[None]:
    """HTTP admission let ``client``'s request in: what the SDK's checks ahead of every
    middleware (``Mcp-Param`` headers) may scope themselves to."""
    token = _ADMITTED.set(client)
    try:
        yield
    finally:
        _ADMITTED.reset(token)


def admitted() -> Principal | None:
    """The client whose HTTP request is being admitted (None: stdio, or not admitted)."""
    return _ADMITTED.get()


def current() -> Principal | None:
    """The client of the request being handled (None outside a request, e.g. the CLI)."""
    return _CURRENT.get()


def visible(kind: Kind, name: str) -> bool:
    """Whether the current client may see ``name`` in a listing; nothing, outside a request
    (fail closed: a listing with no client bound shows none of the catalog)."""
    client = _CURRENT.get()
    return client is not None and client.allows(kind, name)


IDENTIFIED = "agent_gateway.client"
"""Scope key: the client HTTP admission identified a request as (``limits.Admission``), by the
request's verified token or its address; each later step reads it there (``identify``)."""

OPERATOR = Principal("local", "operator", ClientPolicy(), authenticated=True)
"""Whoever runs the gateway's own command line (``agent-gateway ask``): every tool, any
conversation. Never the identity of a request."""


class AccessControl:
    """The configured policies, and one ``Principal`` per client, made on first sight."""

    def __init__(self, config: AuthConfig, clock: Clock = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._principals: dict[str, Principal] = {}
        self._policy_of_token = {t.name: t.policy for t in config.tokens}
        self._required = config.mode != "none"
        self._revision = 0

    def identify(self, request: Any) -> Principal | None:
        """The client an MCP request comes from, by its own verified token (over HTTP) or,
        without auth, its address; None when auth is on and the request carries no verified
        token: such a request is refused, never served as nobody in particular. Over HTTP,
        admission identified it already, from the same token and address (``IDENTIFIED``):
        that client, unless it was forgotten meanwhile (``_forget_idle``, while its body
        arrived): its sessions and calls are then counted on the one kept now."""
        scope = getattr(request, "scope", None)
        known = scope.get(IDENTIFIED) if isinstance(scope, dict) else None  # pyright: ignore[reportUnknownMemberType]
        if isinstance(known, Principal) and self._principals.get(known.label) is known:
            return known
        token = token_of(request)
        if token is None and self._required and request is not None:
            return None
        return self.principal(token, address_of(request))

    def principal(self, token: AccessToken | None, address: str | None = None) -> Principal:
        """The client a verified ``token`` belongs to; without one, the anonymous client at
        ``address``: anonymous clients are told apart by address, so that one of them over
        its limits (rate, sessions, calls in flight) does not hold up the others."""
        subject = ANONYMOUS if token is None else (token.subject or token.client_id)
        key = subject if token is not None or address is None else f"{ANONYMOUS}@{client_key(address)}"
        principal = self._principals.get(key)
        if principal is None:
            if len(self._principals) >= _CLIENTS:
                self._forget_idle()
            static = isinstance(token, StaticAccessToken)  # made by our verifier only: no JWT can be one
            principal = Principal(
                subject, "", ClientPolicy(), None, token is not None, label=key, static=static
            )
            self._apply(principal, fresh=True)
            self._principals[key] = principal
        return principal

    def reconfigure(self, config: AuthConfig) -> set[Principal]:
        """A reload's tokens, subjects and policies (the mode and the JWT settings are read at
        start-up only): each client known is given the policy it would be given now, from its
        next request on (what it has in flight goes on); its rate bucket is new if its rate
        limit changed, and its model tokens of the last hour still count. Returns the clients
        whose policy changed."""
        self._config = config
        self._policy_of_token = {t.name: t.policy for t in config.tokens}
        self._revision += 1
        changed: set[Principal] = set()
        for principal in self._principals.values():
            before = (principal.policy_name, principal.policy)
            self._apply(principal)
            if (principal.policy_name, principal.policy) != before:
                changed.add(principal)
        return changed

    def _apply(self, principal: Principal, fresh: bool = False) -> None:
        """Gives ``principal`` the policy the configuration names for it now (``fresh``: a
        client just made, whose bucket and budget start full)."""
        name = self._policy_name(principal)
        policy = _REVOKED if name == REVOKED else self._config.policy(name)
        if fresh or policy.rate_limit != principal.policy.rate_limit:
            principal.bucket = TokenBucket.of(policy.rate_limit, self._clock) if policy.rate_limit else None
        if fresh or policy.agent != principal.policy.agent:
            principal.spent = spend_of(policy.agent, self._clock, None if fresh else principal.spent)
        principal.policy_name, principal.policy, principal.revision = name, policy, self._revision

    def _forget_idle(self) -> None:
        """Drops the clients with nothing open (addresses are many: the table stays bounded);
        a dropped client that comes back starts with a full bucket."""
        for key, client in list(self._principals.items()):
            if client.in_flight == 0 and client.sessions == 0 and client.opening == 0 and client.held == 0:
                del self._principals[key]

    def client(self, subject: str) -> Principal | None:
        """The client called ``subject``, if it has made a request."""
        return self._principals.get(subject)

    def _policy_name(self, principal: Principal) -> str:
        if not principal.authenticated:
            return "default"
        if principal.static:  # a JWT can never take a static token's policy
            return self._policy_of_token.get(principal.subject, REVOKED)  # a reload took it out
        for pattern, name in self._config.subjects.items():
            if fnmatch.fnmatchcase(principal.subject, pattern):
                return name
        return "default"


def admit(ctx: ServerRequestContext[Any, Any], principal: Principal | None) -> None:
    """Refuse a request whose name no catalog could hold; on stdio, apply ``principal``'s
    rate limit too (over HTTP, admission took the token before the body was read:
    ``limits.Admission``). Raises ``MCPError`` (``errors.to_wire``'s)."""
    _check_name(ctx.method, ctx.params)
    stdio = ctx.request is None
    if stdio and principal is not None and ctx.method not in _UNMETERED:
        _meter(principal, ctx.method)


@contextmanager
def bound(principal: Principal | None) -> Iterator[None]:
    """``principal`` is the client of the request handled inside (``current()``): what a
    listing, which has no identity of its own to read, is filtered by."""
    token = _CURRENT.set(principal)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _meter(principal: Principal, method: str) -> None:
    if principal.bucket is not None and (wait := principal.bucket.take()) is not None:
        logger.warning("client %s over its rate limit (%s)", principal.subject, clipped(method))
        raise to_wire(RateLimited.retry_in(principal.subject, wait))


MAX_URI_LENGTH = 8192
"""The longest resource URI accepted (browsers' and proxies' common bound is 8 KiB)."""
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri", "resources/subscribe": "uri"}


def _check_name(method: str, params: Any) -> None:
    """Refuses a tool or prompt name longer than any public name (64), or an over-long URI,
    before any cache, log line or lookup holds it."""
    field = _NAMED.get(method)
    if field is None or not isinstance(params, Mapping):
        return
    value: Any = params.get(field)  # pyright: ignore[reportUnknownMemberType]
    bound = MAX_NAME_LENGTH if field == "name" else MAX_URI_LENGTH
    if isinstance(value, str) and len(value) > bound:
        refused("name", "refused %s: a %s of %d characters", method, field, len(value))
        what = "public names are" if field == "name" else "URIs are"
        raise to_wire(InvalidRequest(f"{field} is {len(value)} characters long; {what} at most {bound}"))


def token_of(request: Any) -> AccessToken | None:
    """The verified token of an HTTP request (None: no auth, or stdio)."""
    scope = getattr(request, "scope", None)
    return token_of_scope(scope) if isinstance(scope, dict) else None


def address_of(request: Any) -> str | None:
    """The client address of an HTTP request (None: stdio, or in memory)."""
    scope = getattr(request, "scope", None)
    return address_of_scope(scope) if isinstance(scope, dict) else None


def address_of_scope(scope: Mapping[str, Any]) -> str | None:
    client = scope.get("client")
    return str(client[0]) if isinstance(client, tuple | list) and client else None


def header_of_scope(scope: Mapping[str, Any], wanted: bytes) -> str | None:
    """The first value of an ASGI request's header named ``wanted`` (lower case)."""
    for name, value in scope["headers"]:
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def token_of_scope(scope: Mapping[str, Any]) -> AccessToken | None:
    """The verified token of an ASGI request's ``scope`` (None: no auth)."""
    user = scope.get("user")
    if isinstance(user, AuthenticatedUser) and isinstance(user.access_token, AccessToken):
        return user.access_token
    return None
