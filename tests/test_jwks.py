"""An identity provider's outage: while its JWKS cannot be fetched, a token no key held can
check is answered 503 (retried later), not 401 (which would have its client throw a good
token away); keys fetched before still check theirs; the JWKS is fetched at start-up and
again until it is held, and ``/readyz`` says whether any token can be checked."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support import python_upstream, running_gateway, serving
from tests.test_access import client_with

PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


@dataclass
class Provider:
    """An identity provider on loopback whose JWKS endpoint can be taken down and brought
    back; it publishes the keys in ``published`` and counts the fetches it answered."""

    keys: dict[str, Any] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)
    up: bool = True
    fetches: int = 0
    url: str = ""

    def key(self, kid: str) -> Any:
        return self.keys.setdefault(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def token(self, kid: str, sub: str = "alice") -> str:
        now = int(time.time())
        claims = {"iss": "https://idp.test", "aud": "agent-gateway", "sub": sub, "iat": now, "exp": now + 300}
        return jwt.encode(claims, self.key(kid), algorithm="RS256", headers={"kid": kid})

    async def jwks(self, _: Request) -> Response:
        if not self.up:
            return Response("the identity provider is down", status_code=503)
        self.fetches += 1
        public = [
            json.loads(RSAAlgorithm.to_jwk(self.key(kid).public_key())) | {"kid": kid, "alg": "RS256"}
            for kid in self.published
        ]
        return JSONResponse({"keys": public})


@asynccontextmanager
async def provider(*published: str, up: bool = True) -> AsyncIterator[Provider]:
    idp = Provider(published=list(published), up=up)
    async with serving(Starlette(routes=[Route("/jwks.json", idp.jwks)])) as base:
        idp.url = f"{base}/jwks.json"
        yield idp


def jwt_config(idp: Provider) -> dict[str, Any]:
    return {
        "upstreams": {"counter": python_upstream("counter.py")},
        "server": {"public_health": "full"},  # /readyz's problems, read by the tests
        "auth": {
            "mode": "jwt",
            "jwt": {"jwks_url": idp.url, "issuer": "https://idp.test", "audience": "agent-gateway"},
        },
    }


async def pinged(url: str, token: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(url, json=PING, headers={"Authorization": f"Bearer {token}"})


async def until_ready(base: str, bound: float = 20) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(bound):
            while (answer := await http.get(f"{base}/readyz")).status_code != 200:
                await anyio.sleep(0.05)
    body: dict[str, Any] = answer.json()
    return body


async def test_a_provider_down_at_start_up_is_refused_with_503_until_its_keys_come() -> None:
    async with provider("k1", up=False) as idp, running_gateway(jwt_config(idp)) as gw:
        async with httpx.AsyncClient() as http:
            with anyio.fail_after(20):  # the start-up fetch has failed once
                while (readyz := await http.get(f"{gw.base}/readyz")).status_code == 200:
                    await anyio.sleep(0.05)
        assert readyz.status_code == 503
        assert any("keys (JWKS) cannot be fetched" in p for p in readyz.json()["problems"])
        refused = await pinged(gw.url, idp.token("k1"))
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "5"
        told = refused.json()["error"]["message"]
        # What failed, not where: the JWKS URL (which may carry credentials) is the log's.
        assert told == (
            "the identity provider's keys cannot be fetched now (the provider answered HTTP 503); retry later"
        )

        idp.up = True  # no client's token needed: the gateway fetches again by itself
        assert (await until_ready(gw.base))["problems"] == []
        assert idp.fetches >= 1
        async with client_with(gw.url, idp.token("k1")) as client:
            assert "counter__increment" in {t.name for t in (await client.list_tools()).tools}


async def test_during_an_outage_known_keys_still_check_tokens_and_unknown_ones_get_503() -> None:
    async with provider("k1") as idp, running_gateway(jwt_config(idp)) as gw:
        await until_ready(gw.base)
        with anyio.fail_after(20):
            while idp.fetches == 0:  # fetched at start-up, before any token came
                await anyio.sleep(0.05)
        idp.up = False
        async with client_with(gw.url, idp.token("k1")) as client:
            assert "counter__increment" in {t.name for t in (await client.list_tools()).tools}
        rotated = await pinged(gw.url, idp.token("k2"))  # a key published after the outage began
        assert rotated.status_code == 503, rotated.text
        assert rotated.headers["retry-after"] == "5"
        forged = jwt.encode(
            jwt.decode(idp.token("k1"), options={"verify_signature": False}),
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            algorithm="RS256",
            headers={"kid": "k1"},
        )
        assert (await pinged(gw.url, forged)).status_code == 401  # a bad token is still refused as one
        assert (await until_ready(gw.base))["problems"] == []  # its keys are held: still ready


async def test_a_flood_of_made_up_keys_fetches_once_and_a_rotated_keys_token_is_told_to_retry() -> None:
    # The JWKS is fetched for an unknown key at most once per 30 s (FastMCP's interval): a
    # client naming made-up keys had every later unknown key refused 401 meanwhile, a key the
    # provider had just published (a rotation) too, and 401 has its client throw its token away.
    async with provider("k1") as idp, running_gateway(jwt_config(idp)) as gw:
        await until_ready(gw.base)
        fetched = idp.fetches
        assert (await pinged(gw.url, idp.token("made-up-0", sub="mallory"))).status_code == 401
        for n in range(1, 20):
            assert (await pinged(gw.url, idp.token(f"made-up-{n}", sub="mallory"))).status_code == 503
        assert idp.fetches == fetched + 1  # the flood's first only

        idp.published.append("k2")
        rotated = await pinged(gw.url, idp.token("k2"))
        assert rotated.status_code == 503, rotated.text
        assert rotated.headers["retry-after"] == "5"
        assert "fetched again within" in rotated.json()["error"]["message"]
        async with client_with(gw.url, idp.token("k1", sub="bystander")) as bystander:
            assert "counter__increment" in {t.name for t in (await bystander.list_tools()).tools}
