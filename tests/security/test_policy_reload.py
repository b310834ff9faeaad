"""A reload's ``auth`` tokens, subjects and policies, applied to sessions already open: before,
``auth`` was read at start-up only, so tightening a policy or revoking a leaked token took a
restart that ended every client's session (the reload said only "restart to apply")."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import jwt
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning

from agent_gateway.catalog import CatalogChange
from tests.faults.harness import text_of
from tests.security.test_hostile_load import HEADERS, INITIALIZE
from tests.support import python_upstream
from tests.test_reload import counter, from_file, write

CI_TOKEN = "ci-token-0123456789abcdef"
BYSTANDER_TOKEN = "bystander-token-0123456789"
BOUND = 30.0


def _auth(ci_tools: list[str], *, ci: bool = True) -> dict[str, Any]:
    tokens = [{"name": "bystander", "sha256": hashlib.sha256(BYSTANDER_TOKEN.encode()).hexdigest()}]
    if ci:
        tokens.append({"name": "ci", "sha256": hashlib.sha256(CI_TOKEN.encode()).hexdigest(), "policy": "ci"})
    return {"mode": "bearer", "tokens": tokens, "policies": {"ci": {"tools": ci_tools}}}


@asynccontextmanager
async def client(url: str, token: str, on_message: Any = None) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", message_handler=on_message) as c,  # type: ignore[arg-type]
    ):
        yield c


async def test_a_reload_tightening_a_policy_applies_to_an_open_sessions_next_call_and_tells_it(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "g.yaml", {"keep": counter()}, auth=_auth(["*"]))
    told = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told.set()

    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, CI_TOKEN, on_message) as ci,
        client(gw.url, BYSTANDER_TOKEN) as bystander,
    ):
        assert text_of(await ci.call_tool("keep__increment", {})) == "1"
        assert "keep__increment" in {t.name for t in (await ci.list_tools()).tools}

        write(path, {"keep": counter()}, auth=_auth(["keep__pid"]))
        found = await reloader.reload()

        assert found is not None
        with anyio.fail_after(BOUND):
            await told.wait()  # the open session, told its list changed
        refused = await ci.call_tool("keep__increment", {})
        assert refused.is_error
        assert text_of(refused) == "tool 'keep__increment' is not allowed for client 'ci'"
        assert {t.name for t in (await ci.list_tools()).tools} == {"keep__pid"}
        assert not text_of(await ci.call_tool("keep__pid", {})).startswith("tool")
        # The refused call never reached the upstream: the bystander's is its second.
        assert text_of(await bystander.call_tool("keep__increment", {})) == "2"
        assert (found.access, found.needs_restart) == (True, ())


async def test_a_list_made_while_a_reload_rebuilds_the_catalog_is_not_kept_for_the_new_policy(
    tmp_path: Path,
) -> None:
    # A reload rebuilds the catalog, and its clients may list it, before the new policies
    # apply: a list kept under the policy's name alone was served after them too.
    path = write(tmp_path / "g.yaml", {"keep": counter()}, auth=_auth(["*"]))
    async with from_file(path) as (gw, reloader), client(gw.url, CI_TOKEN) as ci:
        meanwhile: list[set[str]] = []

        async def list_meanwhile(change: CatalogChange) -> None:
            if not meanwhile:
                meanwhile.append({t.name for t in (await ci.list_tools()).tools})

        gw.gateway.catalog.subscribe(list_meanwhile)
        write(path, {"keep": counter()}, auth=_auth(["keep__pid"]))
        assert await reloader.reload() is not None

        assert "keep__increment" in meanwhile[0]  # listed under the old policy, then
        assert {t.name for t in (await ci.list_tools()).tools} == {"keep__pid"}


async def test_a_token_a_reload_removes_is_refused_at_its_next_request_while_others_go_on(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "g.yaml", {"keep": counter()}, auth=_auth(["*"]))
    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, BYSTANDER_TOKEN) as bystander,
        httpx.AsyncClient(headers={**HEADERS, "Authorization": f"Bearer {CI_TOKEN}"}) as http,
    ):
        assert (await http.post(gw.url, json=INITIALIZE)).status_code == 200

        write(path, {"keep": counter()}, auth=_auth(["*"], ci=False))
        assert await reloader.reload() is not None

        assert (await http.post(gw.url, json=INITIALIZE)).status_code == 401
        assert text_of(await bystander.call_tool("keep__increment", {})) == "1"


async def test_a_reload_changing_auths_mode_applies_none_of_auth_and_says_restart(tmp_path: Path) -> None:
    path = write(tmp_path / "g.yaml", {"keep": counter()}, auth=_auth(["*"]))
    async with from_file(path) as (gw, reloader), client(gw.url, CI_TOKEN) as ci:
        secret = "s" * 32
        jwt = {"mode": "jwt", "jwt": {"secret": secret, "algorithm": "HS256", "audience": "gw"}}
        write(path, {"keep": counter()}, auth=jwt | {"policies": {"ci": {"tools": ["keep__pid"]}}})
        found = await reloader.reload()

        assert found is not None
        assert found.needs_restart == ("auth",)
        assert not found.access
        assert text_of(await ci.call_tool("keep__increment", {})) == "1"  # its token and policy kept


async def test_a_subscription_a_reload_takes_out_of_the_policy_relays_no_more_updates(tmp_path: Path) -> None:
    # Its updates (which name the resource) kept reaching the client after the reload.
    upstreams = {"rec": python_upstream("recorder.py", protocol="legacy")}
    path = write(tmp_path / "g.yaml", upstreams, auth=_auth(["*"]))
    updated: list[str] = []
    note = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(message.params.uri)
            if message.params.uri == "note://x":
                note.set()

    async with from_file(path) as (gw, reloader), client(gw.url, CI_TOKEN, on_message) as ci:
        for uri in ("counter://value", "note://x"):
            with pytest.warns(MCPDeprecationWarning):
                await ci.subscribe_resource(uri)
        policy = _auth(["*"])
        policy["policies"]["ci"]["resources"] = ["note://*"]
        write(path, upstreams, auth=policy)
        assert await reloader.reload() is not None

        await ci.call_tool("rec__updates", {"uri": "counter://value", "times": 3})
        await ci.call_tool("rec__updates", {"uri": "note://x", "times": 1})
        with anyio.fail_after(BOUND):
            await note.wait()
    assert updated == ["note://x"]


async def test_a_reload_moving_a_jwt_subject_to_another_policy_applies_to_its_open_session(
    tmp_path: Path,
) -> None:
    secret = "a-shared-secret-of-at-least-32-chars!"
    now = int(time.time())
    bearer = jwt.encode({"sub": "svc-build", "aud": "gw", "exp": now + 300}, secret, algorithm="HS256")

    def auth(subjects: dict[str, str]) -> dict[str, Any]:
        settings = {"secret": secret, "algorithm": "HS256", "audience": "gw"}
        policies = {"narrow": {"tools": ["keep__pid"]}}
        return {"mode": "jwt", "jwt": settings, "subjects": subjects, "policies": policies}

    path = write(tmp_path / "g.yaml", {"keep": counter()}, auth=auth({}))
    async with from_file(path) as (gw, reloader), client(gw.url, bearer) as service:
        assert text_of(await service.call_tool("keep__increment", {})) == "1"
        write(path, {"keep": counter()}, auth=auth({"svc-*": "narrow"}))
        assert await reloader.reload() is not None
        refused = await service.call_tool("keep__increment", {})
        assert text_of(refused) == "tool 'keep__increment' is not allowed for client 'svc-build'"


async def test_a_revoked_tokens_open_stream_is_relayed_nothing_not_the_default_policys_all(
    tmp_path: Path,
) -> None:
    # A token a reload removed fell to the ``default`` policy (everything): its session's open
    # stream, which no request re-checks, went on receiving, and more than its policy let it.
    upstreams = {"rec": python_upstream("recorder.py", protocol="legacy")}

    def auth(ci: bool) -> dict[str, Any]:
        narrow = _auth(["*"], ci=ci)
        narrow["policies"]["ci"]["resources"] = ["note://*"]
        return narrow

    path = write(tmp_path / "g.yaml", upstreams, auth=auth(True))
    updated: list[str] = []
    last = anyio.Event()
    relayed = anyio.Semaphore(0)  # the bystander's, relayed after the client's (in order)

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(message.params.uri)
            if message.params.uri == "note://last":
                last.set()

    async def bystanders(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            relayed.release()

    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, CI_TOKEN, on_message) as ci,
        client(gw.url, BYSTANDER_TOKEN, bystanders) as bystander,
    ):
        for subscriber, uri in ((ci, "note://x"), (ci, "note://last"), (bystander, "note://x")):
            with pytest.warns(MCPDeprecationWarning):
                await subscriber.subscribe_resource(uri)
        write(path, upstreams, auth=auth(False))
        assert await reloader.reload() is not None
        assert text_of(await bystander.call_tool("rec__updates", {"uri": "note://x", "times": 2})) == "2"
        with anyio.fail_after(BOUND):
            for _ in range(2):
                await relayed.acquire()  # the bystander still served, and the client's turn past

        write(path, upstreams, auth=auth(True))  # the token back: its stream is relayed again
        assert await reloader.reload() is not None
        await bystander.call_tool("rec__updates", {"uri": "note://last", "times": 1})
        with anyio.fail_after(BOUND):
            await last.wait()  # one stream, in order: all sent before it has arrived
    assert updated == ["note://last"]


async def test_a_catalog_change_is_told_to_the_clients_whose_policy_lists_it_and_no_others(
    tmp_path: Path,
) -> None:
    # `fresh` is in the bystander's list only, `later` in both. Whether a change altered a
    # client's list is asked once per policy: asked once for all, the first client's answer
    # went to everyone (`ci` told of `fresh`, or the bystander not).
    path = write(tmp_path / "g.yaml", {"keep": counter()}, auth=_auth(["keep__pid", "keep__later"]))
    heard: dict[str, list[str]] = {"ci": [], "bystander": []}

    def recorder(who: str) -> Any:
        async def record(message: IncomingMessage) -> None:
            heard[who].append(type(message).__name__)

        return record

    tools = lambda who: heard[who].count("ToolListChangedNotification")  # noqa: E731
    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, CI_TOKEN, recorder("ci")) as ci,
        client(gw.url, BYSTANDER_TOKEN, recorder("bystander")) as bystander,
    ):
        for name, told in (("fresh", 1), ("later", 2)):
            await bystander.call_tool("keep__add_tool", {"name": name})
            with anyio.fail_after(BOUND):
                while tools("bystander") < told:
                    await anyio.sleep(0.01)
        with anyio.fail_after(BOUND):
            while tools("ci") < 1:  # `later`'s, before the reload's
                await anyio.sleep(0.01)
        # A reload widening ci's policy tells ci (alone) that each of its lists may have
        # changed; its prompts notice comes after every tools notice sent to it before.
        write(path, {"keep": counter()}, auth=_auth(["keep__*"]))
        assert await reloader.reload() is not None
        with anyio.fail_after(BOUND):
            while "PromptListChangedNotification" not in heard["ci"]:
                await anyio.sleep(0.01)
        assert {t.name for t in (await ci.list_tools()).tools} >= {"keep__fresh", "keep__later"}
        # A third change in both lists: each client's notices come in the order sent, so once
        # `last`'s has reached both, a notice of the reload sent to the bystander would have too.
        await bystander.call_tool("keep__add_tool", {"name": "last"})
        with anyio.fail_after(BOUND):
            while tools("ci") < 3 or tools("bystander") < 3:
                await anyio.sleep(0.01)
    assert tools("ci") == 3  # `later`, the reload and `last`
    assert tools("bystander") == 3  # `fresh`, `later` and `last`: not the reload
