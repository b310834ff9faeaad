"""Identity edges (issue 16, findings 6 and 7): the JWT claims a token must carry, and
conversations that no subject can reach into another's, whatever its name."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import jwt
import mcp_types as types
import pytest

from agent_gateway.access import Principal
from agent_gateway.agent.threads import owner_of, space_of
from agent_gateway.config_auth import ClientPolicy
from agent_gateway.downstream.sessions import standing
from tests.agent.scripted import ScriptedChatModel, answer
from tests.security.test_hostile_load import INITIALIZE, _echo_server, client
from tests.support import RunningGateway, running_gateway, serving_upstream

SECRET = "a-shared-secret-of-at-least-32-chars!"


def token(**claims: Any) -> str:
    body = {"aud": "gw", "exp": int(time.time()) + 300} | claims
    return jwt.encode({k: v for k, v in body.items() if v is not None}, SECRET, algorithm="HS256")


@asynccontextmanager
async def jwt_gateway(
    model: ScriptedChatModel | None = None, *, leeway: float | None = None
) -> AsyncIterator[RunningGateway]:
    jwt_config: dict[str, Any] = {"secret": SECRET, "algorithm": "HS256", "audience": "gw"}
    if leeway is not None:
        jwt_config["leeway"] = leeway
    async with serving_upstream(_echo_server()) as url:
        config = {
            "upstreams": {"echo": {"url": url}},
            "agent": {"memory": {"store": "memory"}},
            "auth": {
                "mode": "jwt",
                "jwt": jwt_config,
                "subjects": {"admin-*": "admin"},
                "policies": {"admin": {}},
            },
        }
        async with running_gateway(config, chat_model=model) as gw:
            yield gw


async def test_tokens_without_exp_from_the_future_or_without_sub_are_refused() -> None:
    now = int(time.time())
    async with jwt_gateway() as gw, httpx.AsyncClient() as http:

        async def status(bearer: str) -> int:
            headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream"}
            return (await http.post(gw.url, json=INITIALIZE, headers=headers)).status_code

        assert await status(token(sub="bot")) == 200
        assert await status(token(sub="bot", exp=None)) == 401  # would never expire
        assert await status(token(sub="bot", nbf=now + 3600)) == 401
        assert await status(token(sub="bot", iat=now + 3600)) == 401
        assert await status(token(sub="bot", nbf=now + 10, iat=now + 10)) == 200  # within leeway
        assert await status(token(sub="bot", exp=now - 10)) == 401  # expired: no leeway, as documented
        # No subject: client_id/azp are not taken in its place (and matched to admin-*).
        assert await status(token(client_id="admin-evil")) == 401
        assert await status(token(azp="admin-evil")) == 401


async def test_a_configured_leeway_past_fastmcps_own_30_s_is_honoured_for_nbf(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # auth.jwt.leeway allows up to 600 s of clock difference for nbf. FastMCP 4.2's verifier
    # refuses a token whose nbf is over 30 s ahead by itself, before the gateway's check: a
    # token 90 s ahead of a 120 s leeway was refused 401 (its client throws it away), and one
    # past any leeway was refused unlogged and uncounted, as no refusal of the gateway's.
    now = int(time.time())
    async with jwt_gateway(leeway=120) as gw, httpx.AsyncClient() as http:

        async def status(bearer: str) -> int:
            headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream"}
            return (await http.post(gw.url, json=INITIALIZE, headers=headers)).status_code

        assert await status(token(sub="bot", nbf=now + 90)) == 200  # within the configured leeway
        assert await status(token(sub="bot", iat=now + 90)) == 200
        assert "not valid yet (nbf)" not in caplog.text
        assert await status(token(sub="bot", nbf=now + 3600)) == 401
    assert "bearer token refused: not valid yet (nbf)" in caplog.text  # the gateway's refusal


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": math.inf},
        {"nbf": math.nan},
        {"iat": -math.inf},
        {"nbf": -math.inf},
        {"nbf": 10**400},
        {"iat": 10**400},
        {"exp": 10**400},
    ],
    ids=[
        "exp-Infinity",
        "nbf-NaN",
        "iat-minus-Infinity",
        "nbf-minus-Infinity",
        "nbf-huge",
        "iat-huge",
        "exp-huge",
    ],
)
async def test_time_claims_json_does_not_have_are_refused_401_and_a_bystander_served(
    claims: dict[str, float],
) -> None:
    # Python's parser reads NaN and Infinity: an exp of Infinity was a 500 and an ERROR
    # traceback for each request (FastMCP's int(exp)), a NaN nbf let its token in. An integer
    # past a float's range (JSON has no bound) was a 500: at the nbf or iat check (the leeway
    # taken from it overflowed), and for an exp at its notification stream's timer.
    async with jwt_gateway() as gw, httpx.AsyncClient() as http:

        async def status(bearer: str) -> int:
            headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream"}
            return (await http.post(gw.url, json=INITIALIZE, headers=headers)).status_code

        assert await status(token(sub="odd", **claims)) == 401
        assert await status(token(sub="bystander")) == 200


async def test_a_request_with_two_authorization_headers_is_refused_whichever_comes_first() -> None:
    # The SDK read the first: a proxy in front that authorized the request by its last one
    # (another token's) let it in as the first token's client.
    async with jwt_gateway() as gw, httpx.AsyncClient() as http:
        mine, another = token(sub="bot"), token(sub="admin-ops")
        accept = ("Accept", "application/json, text/event-stream")
        for first, second in ((mine, another), (another, mine), (mine, mine)):
            headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}"), accept]
            assert (await http.post(gw.url, json=INITIALIZE, headers=headers)).status_code == 400
        headers = [("Authorization", f"Bearer {mine}"), accept]
        assert (await http.post(gw.url, json=INITIALIZE, headers=headers)).status_code == 200


async def test_a_subject_holding_a_lone_surrogate_is_refused_and_a_bystander_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Validly signed, its sub "\ud800x" is JSON but no UTF-8 text: taken, every ask_agent of
    # it failed with -32603 and a traceback (the thread space's digest could not encode it).
    model = ScriptedChatModel(respond=lambda messages: answer("ok"))
    unnamable = token(sub="\ud800x")
    async with jwt_gateway(model) as gw, httpx.AsyncClient() as http:
        headers = {"Authorization": f"Bearer {unnamable}", "Accept": "application/json, text/event-stream"}
        refused = await http.post(gw.url, json=INITIALIZE, headers=headers)
        served = await ask(gw, "bystander", "still here?", "main")
    assert refused.status_code == 401
    assert "its sub claim is not Unicode text" in caplog.text
    assert not served.is_error
    assert _said(model) == ["still here?"]


def test_a_subject_no_utf8_text_holds_still_has_a_space_of_its_own() -> None:
    # Refused at authentication; a name that got by any other way fails no run for it.
    odd = Principal("\ud800x", "default", ClientPolicy(), authenticated=True)
    replaced = Principal("\ufffdx", "default", ClientPolicy(), authenticated=True)
    assert space_of(odd) != space_of(replaced)
    assert owner_of(odd) != owner_of(replaced)
    assert standing(odd).id != standing(replaced).id


def _said(model: ScriptedChatModel) -> list[str]:
    return [str(m.content) for m in model.seen[-1] if m.type == "human"]


async def ask(gw: RunningGateway, subject: str, query: str, conversation: str) -> types.CallToolResult:
    async with client(gw.url, token(sub=subject)) as c:
        return await c.call_tool("ask_agent", {"query": query, "conversation_id": conversation})


async def test_no_subject_reaches_another_subjects_conversation() -> None:
    model = ScriptedChatModel(respond=lambda messages: answer("ok"))
    async with jwt_gateway(model) as gw:
        await ask(gw, "alice", "alice's secret", "main")
        await ask(gw, "alice/x", "alice/x's secret", "main")
        # sub=anonymous naming "alice/main"; sub=alice naming "x/main": each its own thread.
        await ask(gw, "anonymous", "who am I?", "alice/main")
        assert _said(model) == ["who am I?"]
        await ask(gw, "alice", "and me?", "x/main")
        assert _said(model) == ["and me?"]
        # Alice still has hers.
        mine = await ask(gw, "alice", "again", "main")
        assert _said(model) == ["alice's secret", "again"]
        assert mine.structured_content is not None
        thread = mine.structured_content["thread_id"]
        # Her thread_id, passed back by someone else, is theirs to keep apart too.
        await ask(gw, "alice/x", "peek", thread)
        assert _said(model) == ["peek"]
