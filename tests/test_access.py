"""Auth and per-client policy on HTTP: bearer tokens, JWTs (JWKS and shared secret), the
protected-resource metadata, allowed names, rate limits, concurrency, Host/Origin checks,
the body limit, and no client credential passed upstream."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
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
from cryptography.hazmat.primitives.asymmetric import rsa
from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_headers
from jwt.algorithms import RSAAlgorithm
from langchain_core.messages import ToolMessage
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agent_gateway.access import Principal
from agent_gateway.config import ClientPolicy
from agent_gateway.errors import ConfigError
from agent_gateway.http import build_app
from agent_gateway.logs import PeerRepeats
from agent_gateway.server import Gateway
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.support import (
    answer_before_the_body_ends,
    config_of,
    python_upstream,
    running_gateway,
    serving,
    serving_upstream,
)

CI_TOKEN = "ci-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
POLICIES = {
    "readonly": {"tools": ["counter__increment"], "prompts": [], "resources": []},
    "limited": {"rate_limit": {"per_minute": 10, "burst": 3}},
    "single": {"max_concurrency": 1},
    "pid_only": {"tools": ["counter__pid"]},
    "operators": {"admin": True},
}


@asynccontextmanager
async def client_with(url: str, token: str | None = None, **headers: str) -> AsyncIterator[Client]:
    """An ``mcp`` client sending ``token`` (and ``headers``) with every request."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def bearer_config(**policies: Any) -> dict[str, Any]:
    return {
        "upstreams": {"counter": python_upstream("counter.py")},
        "auth": {
            "mode": "bearer",
            "tokens": [
                {"name": "ci", "sha256": hashlib.sha256(CI_TOKEN.encode()).hexdigest(), "policy": "readonly"},
                {"name": "admin", "token": "${ADMIN_TOKEN}", "policy": "operators"},
                {"name": "burst", "token": "burst-token-0123456789abcdef", "policy": "limited"},
                {"name": "burst2", "token": "burst2-token-0123456789abcdef", "policy": "limited"},
                {"name": "one", "token": "one-token-0123456789abcdef", "policy": "single"},
                {"name": "one2", "token": "one2-token-0123456789abcdef", "policy": "single"},
                {"name": "pids", "token": "pids-token-0123456789abcdef", "policy": "pid_only"},
            ],
            "policies": POLICIES | policies,
        },
    }


@asynccontextmanager
async def bearer_gateway() -> AsyncIterator[Any]:
    async with running_gateway(bearer_config(), environ={"ADMIN_TOKEN": ADMIN_TOKEN}) as gw:
        yield gw


# -- configuration -------------------------------------------------------------------------


def test_no_auth_on_a_public_address_is_refused_unless_explicitly_allowed() -> None:
    # Not only the wildcard: an interface's own address or a name is reached from other machines too.
    for host in ("0.0.0.0", "192.168.1.20", "gateway.internal"):
        with pytest.raises(
            ConfigError, match=rf"auth\.mode: server\.host '{re.escape(host)}' is not loopback"
        ):
            config_of({"server": {"host": host}})
    assert config_of({"server": {"host": "::1"}})
    assert config_of({"server": {"host": "0.0.0.0"}, "auth": {"allow_unauthenticated": True}})
    assert config_of({"server": {"host": "0.0.0.0", "transport": "stdio"}})


def test_auth_configuration_problems_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"auth\.tokens: mode 'bearer' needs at least one token"):
        config_of({"auth": {"mode": "bearer"}})
    with pytest.raises(ConfigError, match=r"auth\.policies: policy 'nope' is used but not defined"):
        config_of(
            {"auth": {"mode": "bearer", "tokens": [{"name": "a", "token": "x" * 16, "policy": "nope"}]}}
        )
    with pytest.raises(ConfigError, match=r"exactly one of 'sha256'"):
        config_of({"auth": {"mode": "bearer", "tokens": [{"name": "a"}]}})
    with pytest.raises(ConfigError, match=r"needs an HS\* algorithm"):
        config_of(
            {"auth": {"mode": "jwt", "jwt": {"secret": "s" * 32, "algorithm": "RS256", "audience": "a"}}}
        )
    with pytest.raises(
        ConfigError, match=r"auth\.jwt\.algorithm: .*'RS256'"
    ):  # check said valid, serve failed
        config_of(
            {"auth": {"mode": "jwt", "jwt": {"secret": "s" * 32, "algorithm": "RS257", "audience": "a"}}}
        )
    jwks = {"jwks_url": "https://idp.test/jwks", "issuer": "https://idp.test", "audience": "a"}
    with pytest.raises(ConfigError, match=r"keys from a jwks_url need a public-key algorithm, not 'HS256'"):
        config_of({"auth": {"mode": "jwt", "jwt": jwks | {"algorithm": "HS256"}}})
    with pytest.raises(ConfigError, match=r"set 'audience'"):
        config_of({"auth": {"mode": "jwt", "jwt": {"secret": "s" * 32, "algorithm": "HS256"}}})
    with pytest.raises(ConfigError, match=r"set 'issuer'"):
        config_of({"auth": {"mode": "jwt", "jwt": {"jwks_url": "https://idp.test/jwks", "audience": "a"}}})
    jwt_block = {"secret": "s" * 32, "algorithm": "HS256", "audience": "a"}
    with pytest.raises(ConfigError, match=r"auth\.tokens: static tokens are for mode 'bearer'"):
        config_of({"auth": {"mode": "jwt", "jwt": jwt_block, "tokens": [{"name": "a", "token": "x" * 16}]}})
    with pytest.raises(ConfigError, match=r"auth\.tokens: two tokens have the same name"):
        config_of(
            {
                "auth": {
                    "mode": "bearer",
                    "tokens": [{"name": "a", "token": "x" * 16}, {"name": "a", "token": "y" * 16}],
                }
            }
        )


def test_secrets_are_not_in_the_configs_repr() -> None:
    config = config_of(bearer_config(), {"ADMIN_TOKEN": ADMIN_TOKEN})
    assert ADMIN_TOKEN not in repr(config)


# -- bearer tokens and policies ------------------------------------------------------------


async def test_requests_without_a_valid_token_get_401_with_a_challenge() -> None:
    async with bearer_gateway() as gw, httpx.AsyncClient() as http:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
            answer = await http.post(
                gw.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers
            )
            assert answer.status_code == 401
            assert answer.headers["www-authenticate"].startswith("Bearer")
        assert (await http.get(f"{gw.base}/healthz")).status_code == 200


async def test_a_client_sees_and_reaches_only_what_its_policy_allows() -> None:
    async with bearer_gateway() as gw:
        async with client_with(gw.url, CI_TOKEN) as ci:
            assert {t.name for t in (await ci.list_tools()).tools} == {"counter__increment"}
            assert text_of(await ci.call_tool("counter__increment", {})) == "1"
            refused = await ci.call_tool("counter__pid", {})
            assert refused.is_error
            assert text_of(refused) == "tool 'counter__pid' is not allowed for client 'ci'"
            refused = await ci.call_tool("ask_agent", {"query": "hi"})
            assert "tool 'ask_agent' is not allowed for client 'ci'" in text_of(refused)
        async with client_with(gw.url, "pids-token-0123456789abcdef") as pids:
            refused = await pids.call_tool("counter__increment", {})
            assert text_of(refused) == "tool 'counter__increment' is not allowed for client 'pids'"
        async with client_with(gw.url, ADMIN_TOKEN) as admin:
            names = {t.name for t in (await admin.list_tools()).tools}
            assert {"counter__increment", "counter__pid", "ask_agent"} <= names
            # 2, not 3: the refused increment never reached the upstream.
            assert text_of(await admin.call_tool("counter__increment", {})) == "2"


async def test_a_client_over_its_rate_limit_is_refused_with_the_wait() -> None:
    async with bearer_gateway() as gw, client_with(gw.url, "burst-token-0123456789abcdef") as client:
        served = 0
        refused: MCPError | None = None
        for _ in range(5):  # a burst of 3 requests (the client may list tools once, too)
            try:
                await client.call_tool("counter__increment", {})
            except MCPError as exc:
                refused = exc
                break
            served += 1
        assert refused is not None
        assert re.fullmatch(
            r"rate limit exceeded for client 'burst': retry in \d\.\ds", refused.error.message
        )
        assert refused.error.code == -32029
        assert 1 <= served <= 3
        # Other clients are not limited by it, even one with the same policy: a bucket each.
        async with client_with(gw.url, "burst2-token-0123456789abcdef") as same_policy:
            assert not (await same_policy.call_tool("counter__increment", {})).is_error
        async with client_with(gw.url, ADMIN_TOKEN) as admin:
            assert not (await admin.call_tool("counter__increment", {})).is_error


async def test_a_client_over_its_concurrency_limit_is_refused_at_once() -> None:
    gate = anyio.Event()
    slow = FastMCP("slow")

    @slow.tool
    async def wait() -> str:
        await gate.wait()
        return "done"

    async with serving_upstream(slow) as url:
        config = bearer_config()
        config["upstreams"] = {"slow": {"url": url}}
        async with (
            running_gateway(config, environ={"ADMIN_TOKEN": ADMIN_TOKEN}) as gw,
            client_with(gw.url, "one-token-0123456789abcdef") as client,
            client_with(gw.url, "one2-token-0123456789abcdef") as same_policy,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(client.call_tool, "slow__wait", {})
            with anyio.fail_after(10):
                while (one := gw.gateway.access.client("one")) is None or one.in_flight == 0:
                    await anyio.sleep(0.01)
            busy = await client.call_tool("slow__wait", {})
            assert (
                text_of(busy) == "client limit: 1 calls already in flight, the limit (max_concurrency) is 1"
            )
            # Another client with the same policy has a count of its own: its call goes through.
            other: list[types.CallToolResult] = []

            async def call_other() -> None:
                other.append(await same_policy.call_tool("slow__wait", {}))

            tg.start_soon(call_other)
            with anyio.fail_after(10):
                while (one2 := gw.gateway.access.client("one2")) is None or one2.in_flight == 0:
                    if other:  # answered before the gate opened: refused
                        raise AssertionError(text_of(other[0]))
                    await anyio.sleep(0.01)
            gate.set()


async def test_the_clients_credentials_never_reach_an_upstream() -> None:
    echo = FastMCP("echo")

    @echo.tool
    def headers() -> dict[str, str]:
        """The HTTP headers this call arrived with."""
        return get_http_headers(include_all=True)

    async with serving_upstream(echo) as url:
        config = bearer_config()
        config["upstreams"] = {"echo": {"url": url, "headers": {"X-Upstream-Key": "upstream-secret"}}}
        async with (
            running_gateway(config, environ={"ADMIN_TOKEN": ADMIN_TOKEN}) as gw,
            client_with(gw.url, ADMIN_TOKEN, **{"X-Client-Secret": "client-secret"}) as client,
        ):
            seen = (await client.call_tool("echo__headers", {})).structured_content
    assert seen is not None
    assert seen["x-upstream-key"] == "upstream-secret"
    assert "authorization" not in seen
    assert "client-secret" not in json.dumps(seen)


# -- JWT -----------------------------------------------------------------------------------


@asynccontextmanager
async def identity_provider() -> AsyncIterator[tuple[str, Any]]:
    """A JWKS endpoint on loopback; yields its URL and the private key that signs tokens."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key()))

    async def jwks(_: Request) -> JSONResponse:
        return JSONResponse({"keys": [public | {"kid": "k1", "use": "sig", "alg": "RS256"}]})

    async with serving(Starlette(routes=[Route("/jwks.json", jwks)])) as base:
        yield f"{base}/jwks.json", key


def signed(key: Any, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": "https://idp.test", "aud": "agent-gateway", "iat": now, "exp": now + 300} | claims
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k1"})


async def test_jwts_are_checked_for_signature_expiry_issuer_and_audience() -> None:
    async with identity_provider() as (jwks_url, key):
        config = {
            "upstreams": {"counter": python_upstream("counter.py")},
            "auth": {
                "mode": "jwt",
                "jwt": {"jwks_url": jwks_url, "issuer": "https://idp.test", "audience": "agent-gateway"},
                "subjects": {"svc-*": "readonly"},
                "policies": POLICIES,
                "public_url": "https://gateway.test",
                "authorization_servers": ["https://idp.test"],
            },
        }
        async with running_gateway(config) as gw:
            async with client_with(gw.url, signed(key, sub="svc-reports")) as service:
                assert {t.name for t in (await service.list_tools()).tools} == {"counter__increment"}
            async with client_with(gw.url, signed(key, sub="alice")) as person:
                assert "counter__pid" in {t.name for t in (await person.list_tools()).tools}
            other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            bad = {
                "expired": signed(key, sub="alice", exp=int(time.time()) - 120),
                "wrong audience": signed(key, sub="alice", aud="someone-else"),
                "wrong issuer": signed(key, sub="alice", iss="https://evil.test"),
                "wrong key": signed(other, sub="alice"),
            }
            async with httpx.AsyncClient() as http:
                for why, token in bad.items():
                    answer = await http.post(
                        gw.url,
                        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    assert answer.status_code == 401, why
                    assert "resource_metadata=" in answer.headers["www-authenticate"]
                metadata = (await http.get(f"{gw.base}/.well-known/oauth-protected-resource/mcp")).json()
            assert metadata["resource"] == "https://gateway.test/mcp"
            assert metadata["authorization_servers"] == ["https://idp.test"]


async def test_a_jwks_over_a_megabyte_is_not_read_and_the_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # FastMCP's fetch read the whole body (100 MB: RSS 162 to 441 MB), each read bounded but
    # not the whole, and logged nothing when it failed.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key())) | {"kid": "k1", "use": "sig", "alg": "RS256"}
    padding = [{"kty": "oct", "kid": f"pad-{n}", "k": "x" * 1000} for n in range(1100)]

    async def jwks(_: Request) -> JSONResponse:
        return JSONResponse({"keys": [public, *padding]})

    async with serving(Starlette(routes=[Route("/jwks.json", jwks)])) as base:
        config = {
            "upstreams": {},
            "auth": {
                "mode": "jwt",
                "jwt": {
                    "jwks_url": f"{base}/jwks.json",
                    "issuer": "https://idp.test",
                    "audience": "agent-gateway",
                },
            },
        }
        async with running_gateway(config) as gw, httpx.AsyncClient() as http:
            answer = await http.post(
                gw.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                headers={"Authorization": f"Bearer {signed(key, sub='alice')}"},
            )
    assert answer.status_code == 503  # the provider's fault, not the token's: retried later
    assert "not fetched: the JWKS is over 1,048,576 bytes" in caplog.text


async def test_jwts_signed_with_a_shared_secret() -> None:
    secret = "a-shared-secret-of-at-least-32-chars!"
    config = {
        "upstreams": {"counter": python_upstream("counter.py")},
        "auth": {"mode": "jwt", "jwt": {"secret": secret, "algorithm": "HS256", "audience": "gw"}},
    }
    async with running_gateway(config) as gw:
        token = jwt.encode(
            {"sub": "bot", "aud": "gw", "exp": int(time.time()) + 60}, secret, algorithm="HS256"
        )
        async with client_with(gw.url, token) as client:
            assert text_of(await client.call_tool("counter__increment", {})) == "1"
        forged = jwt.encode(
            {"sub": "bot", "aud": "gw"}, "another-secret-of-32-characters!!", algorithm="HS256"
        )
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                gw.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                headers={"Authorization": f"Bearer {forged}"},
            )
        assert answer.status_code == 401


# -- Host, Origin and size -----------------------------------------------------------------


async def test_foreign_host_and_origin_headers_are_refused() -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    config = {"server": {"allowed_hosts": ["gateway.test"], "allowed_origins": ["https://ide.test"]}}
    async with running_gateway(config) as gw, httpx.AsyncClient() as http:
        rebinding = await http.post(gw.url, json=ping, headers={"Host": "evil.test"})
        assert rebinding.status_code == 421
        foreign = await http.post(gw.url, json=ping, headers={"Origin": "https://evil.test"})
        assert foreign.status_code == 403
        for headers in ({"Host": "gateway.test"}, {"Origin": "https://ide.test"}):
            answer = await http.post(
                gw.url, json=ping, headers={**headers, "Accept": "application/json, text/event-stream"}
            )
            assert answer.status_code not in (403, 421), headers


async def test_listening_on_every_interface_no_interface_address_passes_as_a_host_unlisted() -> None:
    # Told 0.0.0.0, the server has no one bound address: the one a connection came in on
    # (here 127.0.0.2, not a loopback name) is a Host like any other, listed or refused.
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    config = {"upstreams": {}, "server": {"host": "0.0.0.0"}, "auth": {"allow_unauthenticated": True}}
    gateway = Gateway(config_of(config))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("0.0.0.0", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.2:{port}{gateway.config.server.path}"
    async with gateway.running(), serving(build_app(gateway), sock), httpx.AsyncClient() as http:
        unlisted = await http.post(url, json=ping, headers={**accept, "Host": f"127.0.0.2:{port}"})
        loopback = await http.post(url, json=ping, headers={**accept, "Host": f"localhost:{port}"})
    assert unlisted.status_code == 421
    assert loopback.status_code not in (403, 421)


async def test_a_request_body_over_the_limit_gets_413_and_a_json_rpc_error_before_it_is_sent() -> None:
    config = {"server": {"max_body_bytes": 65536}, "upstreams": {"counter": python_upstream("counter.py")}}
    json_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with running_gateway(config) as gw:
        # Neither body is ever finished: a gateway that read to the end before refusing
        # would never answer. A declared length is refused on the headers alone; a chunked
        # body as soon as it passes the limit.
        with anyio.fail_after(10):
            declared = await answer_before_the_body_ends(
                gw.url, {**json_headers, "Content-Length": "100000000"}
            )
            chunk = b'{"a": "' + b"x" * 70000
            streamed = await answer_before_the_body_ends(
                gw.url,
                {**json_headers, "Transfer-Encoding": "chunked"},
                f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n",
            )
        for answer in (declared, streamed):
            assert answer.status == 413
            error = json.loads(answer.body)["error"]
            assert error["code"] == -32600
            assert "the limit (server.max_body_bytes) is 65536" in error["message"]
        async with Client(gw.url) as client:  # and the gateway serves on
            assert text_of(await client.call_tool("counter__increment", {})) == "1"


async def test_the_agent_shows_and_calls_only_what_the_calling_clients_policy_allows(tmp_path: Path) -> None:
    model = ScriptedChatModel(
        script=[calls(call("counter__pid"), call("counter__increment")), answer("done")]
    )
    config = bearer_config(agent_user={"tools": ["ask_agent", "counter__increment"]})
    config["auth"]["tokens"].append(
        {"name": "asker", "token": "asker-token-0123456789abcdef", "policy": "agent_user"}
    )
    config["agent"] = {"memory": {"store": "memory"}}
    async with (
        running_gateway(config, environ={"ADMIN_TOKEN": ADMIN_TOKEN}, chat_model=model) as gw,
        client_with(gw.url, "asker-token-0123456789abcdef") as client,
    ):
        result = await client.call_tool("ask_agent", {"query": "go"})
        shown = {tool["function"]["name"] if "function" in tool else tool["name"] for tool in model.tools}
        async with client_with(gw.url, ADMIN_TOKEN) as admin:  # another policy, another toolbox
            model.script = [answer("ok")]
            await admin.call_tool("ask_agent", {"query": "and you?"})
            shown_to_admin = {t["function"]["name"] if "function" in t else t["name"] for t in model.tools}
    assert not result.is_error
    assert shown == {"counter__increment"}
    assert {"counter__increment", "counter__pid"} <= shown_to_admin
    [_, tool_turn, *_] = model.seen
    replies = {m.name: str(m.content) for m in tool_turn if isinstance(m, ToolMessage)}
    assert replies["counter__pid"].startswith("Unknown tool 'counter__pid'")  # never forwarded
    assert replies["counter__increment"] == "1"


async def test_prompts_resources_templates_and_completions_are_under_the_policy_too() -> None:
    docs = FastMCP("docs")

    @docs.prompt
    def brief(topic: str) -> str:
        return f"brief on {topic}"

    @docs.resource("file:///docs/readme")
    def readme() -> str:
        return "read me"

    @docs.resource("file:///secret/key")
    def key() -> str:
        return "the key"

    @docs.resource("file:///files/{name}")
    def a_file(name: str) -> str:
        return f"file {name}"

    async with serving_upstream(docs) as url:
        config = bearer_config(docs_reader={"tools": [], "prompts": [], "resources": ["file:///docs/*"]})
        config["upstreams"] = {"docs": {"url": url, "prefix": False}}
        config["auth"]["tokens"].append(
            {"name": "reader", "token": "reader-token-0123456789abcdef", "policy": "docs_reader"}
        )
        async with (
            running_gateway(config, environ={"ADMIN_TOKEN": ADMIN_TOKEN}) as gw,
            client_with(gw.url, "reader-token-0123456789abcdef") as reader,
        ):
            assert [p.name for p in (await reader.list_prompts()).prompts] == []
            listed = {str(r.uri) for r in (await reader.list_resources()).resources}
            assert listed == {"file:///docs/readme"}
            assert (await reader.list_resource_templates()).resource_templates == []
            readme_text = (await reader.read_resource("file:///docs/readme")).contents[0]
            assert getattr(readme_text, "text", None) == "read me"
            refusals = [
                reader.get_prompt("brief", {"topic": "x"}),
                reader.read_resource("file:///secret/key"),
                reader.read_resource("file:///files/key"),
                reader.complete(
                    types.PromptReference(type="ref/prompt", name="brief"), {"name": "topic", "value": "a"}
                ),
            ]
            for refused in refusals:  # answered as names that do not exist (issue 16)
                with pytest.raises(MCPError, match=r"Resource not found: |Unknown prompt: 'brief'"):
                    await refused


def test_a_resource_glob_cannot_be_left_through_dot_segments() -> None:
    policy = ClientPolicy(resources=("file:///docs/*",))
    reader = Principal("reader", "docs", policy)
    assert reader.allows("resource", "file:///docs/guide/intro.md")
    for escape in ("file:///docs/../etc/passwd", "file:///docs/%2e%2e/etc/passwd", "file:///docs/./../x"):
        assert not reader.allows("resource", escape), escape
    assert Principal("admin", "default", ClientPolicy()).allows("resource", "file:///docs/../x")


async def test_an_authenticated_clients_conversations_are_its_own(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[answer("one"), answer("two")])
    config = bearer_config()
    config["agent"] = {"memory": {"store": "memory"}}
    async with running_gateway(config, environ={"ADMIN_TOKEN": ADMIN_TOKEN}, chat_model=model) as gw:
        async with client_with(gw.url, ADMIN_TOKEN) as admin:
            mine = await admin.call_tool("ask_agent", {"query": "my secret plan", "conversation_id": "main"})
        async with client_with(gw.url, "one-token-0123456789abcdef") as other:
            theirs = await other.call_tool(
                "ask_agent", {"query": "what was said?", "conversation_id": "main"}
            )
    assert mine.structured_content is not None
    assert theirs.structured_content is not None
    assert mine.structured_content["thread_id"].endswith(":main")
    assert theirs.structured_content["thread_id"].endswith(":main")
    assert mine.structured_content["thread_id"] != theirs.structured_content["thread_id"]
    assert "my secret plan" not in str(model.seen[1])


async def test_status_needs_a_token_when_auth_is_on_and_odd_bodies_get_400() -> None:
    async with bearer_gateway() as gw, httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.base}/status")).status_code == 401
        authorized = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert (await http.get(f"{gw.base}/status", headers=authorized)).status_code == 200
        deep = (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        )
        answer = await http.post(
            gw.url, content=deep, headers={"Content-Type": "application/json", **authorized}
        )
        assert answer.status_code == 400
        assert "nested too deeply" in answer.json()["error"]["message"]


async def test_a_clients_refused_calls_write_one_warning_a_window_and_anothers_its_own() -> None:
    # Each refusal wrote a WARNING line: eight callers of names outside their policy wrote
    # 4,300 lines in 5 s. Written through the filter the CLI puts on its handler.
    written: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record.getMessage())

    handler = Kept(logging.WARNING)
    handler.addFilter(PeerRepeats())
    logging.getLogger("agent_gateway").addHandler(handler)
    try:
        async with bearer_gateway() as gw:
            for token in (CI_TOKEN, "pids-token-0123456789abcdef"):
                async with client_with(gw.url, token) as client:
                    for _ in range(20):  # counter__reset is outside both policies
                        assert (await client.call_tool("counter__reset", {})).is_error
    finally:
        logging.getLogger("agent_gateway").removeHandler(handler)
    refused = [line for line in written if "refused tool 'counter__reset'" in line]
    assert [line.split()[1] for line in refused] == ["ci", "pids"], refused


async def test_a_refused_requests_error_carries_its_id_when_its_body_tells_it() -> None:
    # Each refusal answered "id": null, though the id was at hand: a client with several
    # requests in flight could not tell which was refused (JSON-RPC 2.0: null only when the
    # id cannot be told). A notification, an id past the first kilobyte: still null.
    headers = {
        "Authorization": "Bearer burst-token-0123456789abcdef",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    ping = {"jsonrpc": "2.0", "method": "ping"}
    async with bearer_gateway() as gw, httpx.AsyncClient(timeout=30) as http:
        ids: list[object] = []
        for n in range(8):  # past the burst of 3
            body = {**ping, "id": f"req-{n}"} if n != 6 else ping
            answer = await http.post(gw.url, headers=headers, json=body)
            if answer.status_code == 429:
                ids.append(answer.json()["id"])
        late = json.dumps({**ping, "params": {"_meta": {"pad": "x" * 2000}}, "id": 9})
        answer = await http.post(gw.url, headers=headers, content=late)
    assert answer.status_code == 429, answer.text
    assert answer.json()["id"] is None
    assert ids[-3:] == ["req-5", None, "req-7"], ids


async def test_a_body_past_the_limit_is_refused_with_its_requests_id() -> None:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    config = {"server": {"max_body_bytes": 65536}, "upstreams": {}}
    call = {"jsonrpc": "2.0", "id": 42, "method": "tools/call"}
    call["params"] = {"name": "x", "arguments": {"a": "x" * 70000}}

    async def chunked() -> AsyncIterator[bytes]:
        yield json.dumps(call).encode()

    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(gw.url, headers=headers, content=chunked())
    assert answer.status_code == 413, answer.text
    assert answer.json()["id"] == 42
