"""Who a token says the client is: static bearer tokens kept as SHA-256 digests, JWTs checked
by FastMCP's verifier and by the gateway's own claim rules, and FastMCP's auth provider
built from ``auth:``. What the client may then do is ``access``'s."""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from typing import Any, Literal, TypeGuard

from fastmcp.server.auth import AccessToken, AuthProvider, RemoteAuthProvider, TokenVerifier

from agent_gateway.compat.fastmcp import BoundedJwks, leave_nbf_to_caller
from agent_gateway.config import AuthConfig
from agent_gateway.refusals import refused


class StaticAccessToken(AccessToken):
    """A configured static token, verified: a type, not a claim, so no JWT can pose as one."""

    secret_id: str = ""
    """Which secret of its name it was (``secret_id_of``, naming no secret): clients are keyed
    by name, so a reload rotating the name's secret tells the old secret's sessions by this."""


class HashedTokenVerifier(TokenVerifier):
    """Static bearer tokens, compared by SHA-256 digest in constant time."""

    def __init__(self, config: AuthConfig, base_url: str | None = None) -> None:
        super().__init__(base_url=base_url)
        self._secret_ids: dict[str, str] = {}
        self.reconfigure(config)

    def reconfigure(self, config: AuthConfig) -> set[str]:
        """The tokens of ``config`` (a reload's): one left out is refused from its next request
        on. The names whose secret it withdrew (rotated or left out)."""
        before = self._secret_ids
        self._digests = [(t.name, _digest_of(t.sha256, t.token)) for t in config.tokens]
        self._secret_ids = {name: secret_id_of(digest) for name, digest in self._digests}
        return {name for name, secret in before.items() if self._secret_ids.get(name) != secret}

    def rotated(self, name: str, secret_id: str) -> bool:
        """Whether the token ``name`` is still configured, with a secret other than the one
        ``secret_id`` names (a name left out is not: its sessions are relayed nothing,
        ``access.REVOKED``, and served again if it comes back with the same secret)."""
        current = self._secret_ids.get(name)
        return current is not None and current != secret_id

    def withdrawn(self, name: str, secret_id: str) -> Withdrawn | None:
        """How the secret ``secret_id`` of the token ``name`` is no longer configured, if it
        is not: its name kept with another secret, or left out."""
        current = self._secret_ids.get(name)
        if current == secret_id:
            return None
        return "removed" if current is None else "rotated"

    async def verify_token(self, token: str) -> AccessToken | None:
        presented = hashlib.sha256(token.encode()).digest()
        # Every digest compared, matched or not: the time taken says nothing about which.
        matched = [name for name, digest in self._digests if hmac.compare_digest(presented, digest)]
        if not matched:
            return None
        # The token itself is not kept: nothing downstream needs it, so nothing can leak it.
        name = matched[0]
        secret_id = self._secret_ids[name]
        return StaticAccessToken(token="", client_id=name, scopes=[], subject=name, secret_id=secret_id)


def secret_id_of(digest: bytes) -> str:
    """What names one static secret among its name's (a digest of its digest: no secret)."""
    return hashlib.sha256(digest).hexdigest()[:16]


Withdrawn = Literal["rotated", "removed"]
"""How a reload withdrew a static token's secret: its name kept with another, or left out."""


def secret_of(token: AccessToken | None) -> str | None:
    """Which static secret ``token`` is (None: no token, or a JWT)."""
    return token.secret_id if isinstance(token, StaticAccessToken) else None


def _digest_of(sha256: str | None, token: str | None) -> bytes:
    if sha256 is not None:
        return bytes.fromhex(sha256)
    assert token is not None  # StaticToken validation: exactly one is set
    return hashlib.sha256(token.encode()).digest()


class ClaimedJWTVerifier(BoundedJwks):
    """FastMCP's JWT checks (signature, issuer, audience, an ``exp`` in the past: with no
    leeway, which it does not take), and ours: ``exp`` required, ``nbf`` and ``iat`` not in
    the future (with ``leeway``), and the
    subject read from one configured claim: FastMCP would take ``client_id`` or ``azp``
    when ``sub`` is missing, which a token's issuer never meant as the client's name."""

    def __init__(self, subject_claim: str, leeway: float, **options: Any) -> None:
        super().__init__(**options)
        leave_nbf_to_caller()  # FastMCP's own 30 s would cut a larger leeway short
        self._subject_claim = subject_claim
        self._leeway = leeway

    async def load_access_token(self, token: str) -> AccessToken | None:
        try:
            verified = await super().load_access_token(token)
        except RecursionError:  # FastMCP reads the header before any check: a 2.7 KB token did it
            refused("token", "bearer token refused: %s", "its header nests too deeply to read")
            return None
        except OverflowError:  # FastMCP's int(exp) of an Infinity Python's parser read: a 500 each
            refused("token", "bearer token refused: %s", "its exp claim is not a number JSON has")
            return None
        if verified is None:
            return None
        claims: dict[str, Any] = dict(verified.claims or {})
        if (problem := self._claims_problem(claims)) is not None:
            refused("token", "bearer token refused: %s", problem)
            return None
        subject = str(claims[self._subject_claim])
        return verified.model_copy(update={"subject": subject, "client_id": subject})

    def _claims_problem(self, claims: dict[str, Any]) -> str | None:
        now = time.time()
        exp, nbf, iat = claims.get("exp"), claims.get("nbf"), claims.get("iat")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            return "no exp claim (a token that never expires is not accepted)"
        if any(isinstance(claim, float) and not math.isfinite(claim) for claim in (exp, nbf, iat)):
            # Python's parser reads them; a NaN nbf passed as valid, as every comparison is False.
            return "a time claim (exp, nbf or iat) is NaN or Infinity, which JSON does not have"
        if any(_is_time(claim) and abs(claim) > _LATEST for claim in (exp, nbf, iat)):
            # JSON's integers have no bound: an exp of 10**400 held its stream's timer past a
            # float's range (a 500 at its GET).
            return "a time claim (exp, nbf or iat) is out of range (beyond the year 9999)"
        # Compared with now + leeway, never nbf - leeway: an integer past a float's range (JSON
        # has no bound) overflowed in that subtraction, a 500; int and float compare exactly.
        if nbf is not None and (not _is_time(nbf) or nbf > now + self._leeway):
            return "not valid yet (nbf)"
        if iat is not None and (not _is_time(iat) or iat > now + self._leeway):
            return "issued in the future (iat)"
        subject = claims.get(self._subject_claim)
        if not isinstance(subject, str) or not subject:
            return f"no {self._subject_claim} claim"
        if not _is_text(subject):
            # A lone UTF-16 surrogate: valid JSON, but no UTF-8 text holds it, so no client
            # can be named by it (every digest, log and page of its name would fail on it).
            return f"its {self._subject_claim} claim is not Unicode text (a lone surrogate)"
        return None


def _is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


_LATEST = 253_402_300_799
"""9999-12-31T23:59:59Z: the latest time a claim may name (RFC 7519's NumericDate is any number)."""


def _is_time(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def build_auth(config: AuthConfig) -> AuthProvider | None:
    """FastMCP's auth provider for ``config`` (None for ``mode: none``)."""
    if config.mode == "none":
        return None
    verifier: TokenVerifier
    if config.mode == "bearer":
        verifier = HashedTokenVerifier(config, base_url=config.public_url)
    else:
        assert config.jwt is not None  # AuthConfig validation
        jwt = config.jwt
        verifier = ClaimedJWTVerifier(
            jwt.subject_claim,
            jwt.leeway,
            public_key=jwt.secret,
            jwks_uri=jwt.jwks_url,
            issuer=jwt.issuer,
            audience=jwt.audience,
            algorithm=jwt.algorithm,
            base_url=config.public_url,
        )
    if config.public_url is None:
        return verifier
    # The metadata clients follow from the 401 challenge (RFC 9728): where tokens come from.
    return RemoteAuthProvider(
        verifier,
        authorization_servers=list(config.authorization_servers),  # pyright: ignore[reportArgumentType]
        base_url=config.public_url,
    )


def _verifier_of(auth: AuthProvider | None) -> AuthProvider | TokenVerifier | None:
    return auth.token_verifier if isinstance(auth, RemoteAuthProvider) else auth


def static_tokens_of(auth: AuthProvider | None) -> HashedTokenVerifier | None:
    """The verifier of ``auth`` that holds the static tokens, if any."""
    verifier = _verifier_of(auth)
    return verifier if isinstance(verifier, HashedTokenVerifier) else None


def keys_of(auth: AuthProvider | None) -> BoundedJwks | None:
    """The verifier of ``auth`` that fetches its keys from an identity provider, if any."""
    verifier = _verifier_of(auth)
    return verifier if isinstance(verifier, BoundedJwks) and verifier.jwks_uri else None
