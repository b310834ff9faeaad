"""Fail closed (issue 18): a request that reaches the pipeline with no identity is refused,
never served as nobody in particular; the upstream, which counts what it is sent, shows that
nothing went through.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.requests import Request

from agent_gateway.access import AccessControl
from agent_gateway.errors import NotAllowed
from agent_gateway.server import Gateway
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.replicas.test_store import events
from tests.security.test_hostile_load import HEADERS, INITIALIZE
from tests.support import config_of, python_upstream, running_gateway

TOKEN = "fail-closed-token-0123456789ab"


def bearer() -> dict[str, object]:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    return {
        "upstreams": {"counter": python_upstream("counter.py")},
        "auth": {"mode": "bearer", "tokens": [{"name": "ci", "sha256": digest}]},
    }


def test_with_auth_on_a_request_without_a_verified_token_has_no_identity() -> None:
    access = AccessControl(config_of(bearer()).auth)
    unverified = Request({"type": "http", "headers": [], "client": ("127.0.0.1", 5000)})
    assert access.identify(unverified) is None
    # Without auth, the same request is the anonymous client at its address.
    open_access = AccessControl(config_of({"upstreams": {}}).auth)
    anonymous = open_access.identify(unverified)
    assert anonymous is not None
    assert anonymous.subject == "anonymous"


async def test_the_pipeline_refuses_a_call_with_no_identity_and_sends_nothing() -> None:
    async with running_gateway(bearer(), settle_timeout=20) as gw:
        gateway: Gateway = gw.gateway
        with pytest.raises(NotAllowed, match="no identity"):
            await gateway.proxy.call_tool("counter__increment", {"by": 5}, None)
        # The far end: the first call that does arrive finds the counter untouched.
        first = await gateway.proxy.call_tool(
            "counter__increment", {"by": 1}, None, gateway.access.principal(None)
        )
    assert not first.is_error  # type: ignore[union-attr]
    assert first.structured_content == {"result": 1}  # type: ignore[union-attr]


async def test_an_unauthenticated_http_request_is_refused_before_the_pipeline() -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "counter__increment"}}
    headers = {"accept": "application/json, text/event-stream"}
    async with running_gateway(bearer(), settle_timeout=20) as gw, httpx.AsyncClient() as http:
        refused = await http.post(gw.url, json=call, headers=headers)
        counted = await gw.gateway.proxy.call_tool(
            "counter__increment", {"by": 1}, None, gw.gateway.access.principal(None)
        )
    assert refused.status_code == 401
    assert counted.structured_content == {"result": 1}  # type: ignore[union-attr]  # nothing got through


async def test_ask_agent_on_the_pipeline_refuses_a_request_with_no_identity_and_runs_nothing() -> None:
    # A request whose token was never verified, as the pipeline gets it: the agent must not
    # run for nobody in particular (the model would be asked, the counter increased).
    model = ScriptedChatModel(script=[calls(call("counter__increment", by=5)), answer("done")])
    config = {**bearer(), "agent": {"memory": {"store": "memory"}}}
    unverified = Request({"type": "http", "headers": [], "client": ("127.0.0.1", 5000)})
    params = types.CallToolRequestParams(name="ask_agent", arguments={"query": "count"})
    async with running_gateway(config, settle_timeout=20, chat_model=model) as gw:
        gateway: Gateway = gw.gateway
        refused = await gateway.pipeline.call_tool(SimpleNamespace(request=unverified), params)  # type: ignore[arg-type]
        counted = await gateway.proxy.call_tool(
            "counter__increment", {"by": 1}, None, gateway.access.principal(None)
        )
    assert refused.is_error
    assert "no identity" in refused.content[0].text
    assert model.seen == []  # the model was never asked
    assert counted.structured_content == {"result": 1}  # type: ignore[union-attr]  # nothing got through


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_http_request_is_identified_once_by_admission_and_read_after(mode: str) -> None:
    # Issue 18, item 1: identified once. Each later step (the request wrapper, the pipeline)
    # reads the client admission found for the request's token and address.
    async with running_gateway(bearer()) as gw:
        access = gw.gateway.access
        made = access.principal
        identified: list[str] = []

        def counted(*args: object, **kwargs: object) -> object:
            principal = made(*args, **kwargs)  # type: ignore[arg-type]
            identified.append(principal.subject)
            return principal

        headers = {"authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(gw.url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
        ):
            await client.list_tools()  # the handshake, before the one call counted
            access.principal = counted  # type: ignore[method-assign]
            result = await client.call_tool("counter__increment", {})
            access.principal = made  # type: ignore[method-assign]  # its DELETE at the end is a request of its own
    assert not result.is_error
    assert identified == ["ci"]


async def test_a_client_forgotten_while_its_body_arrives_is_still_held_to_its_max_sessions() -> None:
    # Admission identifies a client before its body arrives; if 10,000 other clients arrive
    # meanwhile, it is forgotten (idle, as far as the table knows). Its session must then be
    # counted on the client the table keeps, or its next session would pass max_sessions.
    async with running_gateway(
        {"upstreams": {}, "auth": {"policies": {"default": {"max_sessions": 1}}}}
    ) as gw:
        access = gw.gateway.access
        body = json.dumps(INITIALIZE).encode()
        arrived = anyio.Event()

        async def slowly() -> AsyncIterator[bytes]:
            # Nothing of it yet: a body's bytes held are something the client has open, and a
            # client with something open is never forgotten.
            await arrived.wait()
            yield body

        opened: list[httpx.Response] = []
        async with httpx.AsyncClient(timeout=10) as http:

            async def first() -> None:
                headers = HEADERS | {"content-length": str(len(body))}
                opened.append(await http.post(gw.url, content=slowly(), headers=headers))

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                with anyio.fail_after(5):  # admission has identified it and reads its body
                    while access.client("anonymous@127.0.0.1") is None:
                        await anyio.sleep(0.01)
                for i in range(10_000):
                    access.principal(None, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
                assert access.client("anonymous@127.0.0.1") is None
                arrived.set()
            session = HEADERS | {"mcp-session-id": opened[0].headers["mcp-session-id"]}
            await http.post(
                gw.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session
            )
            # Its stream open: busy, it is not ended to make room for the next (as an idle one is).
            async with events(
                http,
                gw.url,
                {"mcp-session-id": session["mcp-session-id"], "mcp-protocol-version": "2025-06-18"},
            ):
                second = await http.post(gw.url, json=INITIALIZE, headers=HEADERS)
    assert opened[0].status_code == 200
    assert second.status_code == 429, second.text  # max_sessions 1, and one is open
