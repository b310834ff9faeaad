"""``auth:``: who may use the HTTP endpoint, and what each client may do (its policy)."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent_gateway.config_base import FieldProblem
from agent_gateway.config_base import Strict as _Strict


class RateLimit(_Strict):
    """A token bucket: ``per_minute`` requests on average, at most ``burst`` at once."""

    per_minute: float = Field(gt=0, le=1_000_000)
    burst: int = Field(default=10, ge=1, le=100_000)


class AgentBudget(_Strict):
    """What one client may spend on ``ask_agent``'s model (a paid provider bills per token)."""

    runs_per_minute: float | None = Field(default=60.0, gt=0, le=100_000)
    """Agent runs started per minute (a bucket of this size); None: no bound."""
    tokens_per_hour: int | None = Field(default=None, ge=1)
    """Model tokens (input and output) over the last hour; past it new runs are refused."""


class ClientPolicy(_Strict):
    """What one client may reach (globs over public names and URIs) and how fast."""

    tools: tuple[str, ...] = ("*",)
    prompts: tuple[str, ...] = ("*",)
    resources: tuple[str, ...] = ("*",)
    rate_limit: RateLimit | None = None
    """Requests and notifications (every HTTP POST, ``initialize`` too); None: no limit."""
    max_concurrency: int | None = Field(default=64, ge=1, le=100_000)
    """Tool calls and agent runs this client may have in flight at once; one more is
    refused. 64 by default, so one client cannot take an upstream's whole connection pool."""
    agent: AgentBudget = Field(default_factory=AgentBudget)
    admin: bool = False
    """May read ``/status`` and the status page (and ``/metrics`` when ``public_health`` is
    minimal, as it is by default with auth on): upstream hosts, errors, every client's calls."""
    max_sessions: int = Field(default=100, ge=1, le=100_000)
    """Sessions this client may have open at once (a modern-era request is a session while
    it runs); one more is refused, other clients' are not."""
    max_subscriptions: int = Field(default=1000, ge=1, le=100_000)
    """Resource subscriptions one of this client's sessions may hold (a modern-era listen
    stream is a session: the resources it names); one more is refused."""


class StaticToken(_Strict):
    """A bearer token the gateway accepts, stored as its SHA-256 or read from the environment."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.@:-]{1,64}$")
    """The client's name: its subject in logs, spans and policies."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    token: str | None = Field(default=None, min_length=16, repr=False)
    policy: str = "default"

    @field_validator("name")
    @classmethod
    def _not_anonymous(cls, name: str) -> str:
        # Clients without a token are keyed so (``access.ANONYMOUS``, by address
        # ``anonymous@…``): a token of that name shared their limits and policy (a stdio client's).
        if name == "anonymous" or name.startswith("anonymous@"):
            raise ValueError(f"{name!r} names clients without a token (stdio, or by address): choose another")
        return name

    @model_validator(mode="after")
    def _one_secret(self) -> StaticToken:
        if (self.sha256 is None) == (self.token is None):
            raise ValueError("set exactly one of 'sha256' (hex digest of the token) or 'token' (e.g. ${VAR})")
        return self


def _one_client_per_secret(tokens: tuple[StaticToken, ...]) -> None:
    """Two names for one secret (a ``${VAR}`` pasted twice) gave its bearer the first one's
    policy, silently; the second name's never applied."""
    seen: dict[str, str] = {}
    for token in tokens:
        digest = (
            token.sha256.lower() if token.sha256 else hashlib.sha256((token.token or "").encode()).hexdigest()
        )
        if digest in seen:
            raise FieldProblem(
                ("auth", "tokens"), f"tokens {seen[digest]!r} and {token.name!r} are the same secret"
            )
        seen[digest] = token.name


class JwtConfig(_Strict):
    """JWTs from an identity provider: keys from a JWKS URL, or a shared secret (HS*)."""

    jwks_url: str | None = Field(default=None, pattern=r"^https?://")
    secret: str | None = Field(default=None, min_length=32, repr=False)
    algorithm: Literal[
        "RS256",
        "RS384",
        "RS512",
        "PS256",
        "PS384",
        "PS512",
        "ES256",
        "ES384",
        "ES512",
        "EdDSA",
        "Ed25519",
        "Ed448",
        "HS256",
        "HS384",
        "HS512",
    ] = "RS256"
    """What FastMCP's verifier accepts (``check`` said any other was valid, ``serve`` then failed)."""
    issuer: str | None = None
    audience: str | None = None
    subject_claim: str = Field(default="sub", min_length=1)
    """The claim naming the client (its subject in policies, logs and conversations); a
    token without it is refused. Never a fallback to another claim."""
    leeway: float = Field(default=30.0, ge=0, le=600)
    """Seconds of clock difference allowed for ``nbf`` and ``iat`` (not ``exp``: FastMCP's
    check and the SDK's refuse a past one outright)."""

    @model_validator(mode="after")
    def _one_key(self) -> JwtConfig:
        if (self.jwks_url is None) == (self.secret is None):
            raise ValueError("set exactly one of 'jwks_url' or 'secret'")
        if self.secret is not None and not self.algorithm.startswith("HS"):
            raise ValueError(f"a shared secret needs an HS* algorithm, not {self.algorithm!r}")
        if self.jwks_url is not None and self.algorithm.startswith("HS"):
            raise ValueError(f"keys from a jwks_url need a public-key algorithm, not {self.algorithm!r}")
        # Without them any token the key signs is accepted, minted for whichever application.
        if self.audience is None:
            raise ValueError("set 'audience' (this gateway's name in the tokens' aud claim)")
        if self.jwks_url is not None and self.issuer is None:
            raise ValueError("set 'issuer' (the identity provider's iss) with a jwks_url")
        return self


class AuthConfig(_Strict):
    """Who may use the HTTP endpoint, and each client's policy."""

    mode: Literal["none", "bearer", "jwt"] = "none"
    allow_unauthenticated: bool = False
    """Allow ``mode: none`` on an address other than loopback (you secure it some other way)."""
    tokens: tuple[StaticToken, ...] = ()
    jwt: JwtConfig | None = None
    subjects: dict[str, str] = Field(default_factory=dict)
    """JWT subject globs to policy names, first match wins; others get ``default``."""
    policies: dict[str, ClientPolicy] = Field(default_factory=dict)
    """Named policies; ``default`` (everything, no limits unless set) applies to the rest."""
    public_url: str | None = Field(default=None, pattern=r"^https?://[^/]+/?$")
    """This gateway's public base URL (``https://gw.example.com``): with ``server.path`` it is
    the resource advertised in OAuth protected-resource metadata (RFC 9728)."""
    authorization_servers: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _complete(self) -> AuthConfig:
        if self.mode == "bearer" and not self.tokens:
            raise FieldProblem(("auth", "tokens"), "mode 'bearer' needs at least one token")
        if self.mode == "jwt" and self.jwt is None:
            raise FieldProblem(("auth", "jwt"), "mode 'jwt' needs a 'jwt' block")
        if self.mode != "bearer" and self.tokens:
            raise FieldProblem(("auth", "tokens"), f"static tokens are for mode 'bearer', not {self.mode!r}")
        names = [t.name for t in self.tokens]
        if len(set(names)) != len(names):
            raise FieldProblem(("auth", "tokens"), "two tokens have the same name")
        _one_client_per_secret(self.tokens)
        for name in [t.policy for t in self.tokens] + list(self.subjects.values()):
            if name != "default" and name not in self.policies:
                raise FieldProblem(("auth", "policies"), f"policy {name!r} is used but not defined")
        return self

    def policy(self, name: str) -> ClientPolicy:
        return self.policies.get(name) or ClientPolicy()
