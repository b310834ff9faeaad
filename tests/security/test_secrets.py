"""Secrets in URLs and in model errors (issue 16, finding 12): ``check`` and every log line
(debug included) print URLs without credentials or query values; a model error that echoes
the API key in another case, in part or masked reaches no client; nor does an upstream's error
result quoting the credential the gateway sends it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import yaml
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from mcp import Client
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse

from agent_gateway.cli import main
from agent_gateway.logs import scrubbed
from tests.support import (
    asgi_in_a_thread,
    gateway_env,
    intercepted,
    python_upstream,
    running_gateway,
    serving,
    serving_upstream,
)

AGENT_GATEWAY = str(Path(sys.executable).parent / "agent-gateway")
PASSWORD = "hunter2-password"
API_KEY = "query-secret-0123456789"
TOKEN = "token-secret-9876543210"


@contextmanager
def upstream_in_a_thread() -> Iterator[int]:
    server = FastMCP("quiet")

    @server.tool
    def hello() -> str:
        return "hi"

    with asgi_in_a_thread(server.http_app(path="/mcp")) as port:
        yield port


def test_check_and_debug_logs_print_urls_without_credentials_or_query_values(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with upstream_in_a_thread() as port:
        url = f"http://admin:{PASSWORD}@127.0.0.1:{port}/mcp?api_key={API_KEY}"
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"upstreams": {"quiet": {"url": url}}, "agent": {"enabled": False}}))
        assert main(["check", "--offline", "-c", str(config)]) == 0
        main(["--log-level", "debug", "check", "-c", str(config)])
    out, err = capfd.readouterr()
    assert "127.0.0.1" in out
    assert "***@127.0.0.1" in out
    assert "api_key=***" in out
    for secret in (PASSWORD, API_KEY):
        assert secret not in out
        assert secret not in err


def test_check_and_the_start_log_print_a_command_line_without_its_credentials(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Printed whole: servers take their database URL or key as an argument (server-postgres
    # reads "postgresql://user:password@host/db"), often from ${VAR}.
    upstream = python_upstream("counter.py")
    upstream["args"] += [f"postgresql://admin:{PASSWORD}@db/x", "--api-key", API_KEY, f"--token={TOKEN}"]
    out, err = printed(tmp_path, capfd, "pg", upstream, {})
    assert "postgresql://***@db/x --api-key *** --token=***" in out
    assert "starting pg (" in err
    for secret in (PASSWORD, API_KEY, TOKEN):
        assert secret not in out
        assert secret not in err


def test_a_credential_given_as_a_bare_argument_from_the_environment_is_not_printed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Servers take their key as a positional argument (``args: ["${GITHUB_TOKEN}"]``): once
    # expanded it is a bare word no flag names, and check and the start log printed it.
    token = "tok-" + "Q7" * 18  # no well-known format: masked as the variable's value
    monkeypatch.setenv("GITHUB_TOKEN", token)
    monkeypatch.setenv("AGW_TEST_REGION", "eu-west-1-long")  # not named like a credential: shown
    upstream = python_upstream("counter.py")
    upstream["args"] += ["${GITHUB_TOKEN}", "${AGW_TEST_REGION}", "owner=${GITHUB_TOKEN}"]
    out, err = printed(
        tmp_path, capfd, "gh", upstream, {"GITHUB_TOKEN": token, "AGW_TEST_REGION": "eu-west-1-long"}
    )
    assert "counter.py *** eu-west-1-long owner=***" in out
    assert "starting gh (" in err
    assert token not in out
    assert token not in err


def test_a_credential_of_a_known_format_typed_into_args_is_not_printed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Typed into the configuration as it is, no flag or environment variable names it.
    github, openai, aws = "ghp_" + "Z3" * 18, "sk-proj-" + "a1B2" * 8, "AKIA" + "ABCDEFGHIJKLMNOP"
    upstream = python_upstream("counter.py")
    upstream["args"] += [github, f"key:{openai}", aws, "plain-word-ghp_short"]
    out, err = printed(tmp_path, capfd, "gh", upstream, {})
    assert "counter.py *** key:*** *** plain-word-ghp_short" in out
    for secret in (github, openai, aws):
        assert secret not in out
        assert secret not in err


def printed(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    name: str,
    upstream: dict[str, Any],
    env: dict[str, str],
) -> tuple[str, str]:
    """What ``check --offline`` prints of ``upstream`` (this process), and the log lines of a
    ``check`` run in a process of its own (``env`` added to its environment)."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"upstreams": {name: upstream}, "agent": {"enabled": False}}))
    assert main(["check", "--offline", "-c", str(config)]) == 0
    out = capfd.readouterr().out
    started = subprocess.run(  # a process of its own: its log lines as they are written
        [AGENT_GATEWAY, "--log-level", "info", "check", "-c", str(config)],
        capture_output=True,
        text=True,
        env={**gateway_env(), **env},
        timeout=120,
        check=True,
    )
    return out, started.stderr


def test_a_model_error_echoing_the_key_changed_in_part_or_masked_is_scrubbed() -> None:
    key = "sk-live-ABCDEFGHIJKLMNOP1234"
    echoes = {
        "whole": f"invalid key {key}",
        "upper": f"invalid key {key.upper()}",
        "lower": f"invalid key {key.lower()}",
        "part": "key ending ...GHIJKLMNOP1234 was refused",
        "masked": "Incorrect API key provided: sk-...1234",
        "masked stars": "Incorrect API key provided: sk-***************1234",
    }
    for name, text in echoes.items():
        cleaned = scrubbed(text, (key,))
        assert "[redacted]" in cleaned, name
        assert "GHIJKLMN" not in cleaned.upper(), name
        assert "1234" not in cleaned, name
    assert scrubbed("nothing secret here", (key,)) == "nothing secret here"


UPSTREAM_KEY = "sk-upstream-0123456789abcdef"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstreams_error_result_quoting_its_credential_reaches_its_client_without_it(
    mode: str,
) -> None:
    # The gateway sends the upstream a credential its clients never see; an upstream's error
    # *result* (isError: ``invalid credentials: 'Bearer …'``) reached the client whole, in its
    # text, its embedded resources and its structuredContent. A successful result is passed
    # as it is (a configured value may be any word of 8 characters, a path its results name).
    server = FastMCP("vault")

    @server.tool
    def login() -> types.CallToolResult:
        quoted = f"invalid credentials: 'Bearer {UPSTREAM_KEY}'"
        resource = types.TextResourceContents(uri="log://last", text=f"sent {UPSTREAM_KEY}")
        link = types.ResourceLink(name="retry", uri=f"https://vault.example/login?key={UPSTREAM_KEY}")
        return types.CallToolResult(
            content=[types.TextContent(text=quoted), types.EmbeddedResource(resource=resource), link],
            structured_content={"sent": {"headers": [f"Bearer {UPSTREAM_KEY}"]}, "code": 401},
            is_error=True,
            _meta={"vault/request": {"authorization": f"Bearer {UPSTREAM_KEY}"}},
        )

    @server.tool
    def whoami() -> str:
        return f"/srv/{UPSTREAM_KEY}/home"

    async with serving_upstream(server) as url:
        config = {
            "upstreams": {"vault": {"url": url, "headers": {"Authorization": f"Bearer {UPSTREAM_KEY}"}}}
        }
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            refused = await client.call_tool("vault__login", {})
            served = await client.call_tool("vault__whoami", {})
    assert refused.is_error
    text, embedded, link = refused.content
    assert isinstance(text, types.TextContent)
    assert isinstance(embedded, types.EmbeddedResource)
    assert text.text == "invalid credentials: 'Bearer [redacted]'"
    assert isinstance(embedded.resource, types.TextResourceContents)
    assert embedded.resource.text == "sent [redacted]"
    assert isinstance(link, types.ResourceLink)  # the rest of a result quotes it too
    assert link.uri == "https://vault.example/login?key=[redacted]"
    assert refused.structured_content == {"sent": {"headers": ["Bearer [redacted]"]}, "code": 401}
    assert refused.meta is not None
    assert refused.meta["vault/request"] == {"authorization": "Bearer [redacted]"}
    assert UPSTREAM_KEY not in refused.model_dump_json()
    assert not served.is_error
    assert served.content == [types.TextContent(text=f"/srv/{UPSTREAM_KEY}/home")]


ACCOUNT = 123456789012


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_error_result_whose_structured_content_holds_the_credential_as_a_number_reaches_its_client(
    mode: str,
) -> None:
    # A configured value of digits (an account's id sent as a header) quoted as a number in an
    # error result's structuredContent: replaced in the result's JSON text, it left ``[redacted]``
    # bare where a number stood, which no JSON parser reads, and the client got an internal
    # error instead of the upstream's answer. The bystander's tool keeps being served.
    server = FastMCP("billing")

    @server.tool
    def charge() -> types.CallToolResult:
        return types.CallToolResult(
            content=[types.TextContent(text=f"account {ACCOUNT} is closed")],
            structured_content={"account": ACCOUNT, "accounts": [ACCOUNT * 10 + 7], "code": 402},
            is_error=True,
        )

    @server.tool
    def balance() -> str:
        return "0"

    async with serving_upstream(server) as url:
        config = {"upstreams": {"billing": {"url": url, "headers": {"X-Account": str(ACCOUNT)}}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            refused = await client.call_tool("billing__charge", {})
            served = await client.call_tool("billing__balance", {})
    assert refused.is_error
    assert refused.content == [types.TextContent(text="account [redacted] is closed")]
    assert refused.structured_content == {"account": "[redacted]", "accounts": ["[redacted]"], "code": 402}
    assert not served.is_error


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_json_rpc_error_whose_data_holds_the_credential_as_a_number_reaches_its_client(
    mode: str,
) -> None:
    # The same value in a JSON-RPC error's ``data``: scrubbed in its JSON text, the number left
    # a bare ``[redacted]`` that ``json.loads`` refused, and the client got an internal error
    # in place of the upstream's code, message and data.
    server = FastMCP("billing")

    @server.resource("note://balance")
    def balance() -> str:
        return "0"

    @server.prompt
    def brief(topic: str) -> str:
        return topic

    async def intercept(scope: Any, message: dict[str, Any], send: Any) -> bool:
        if message.get("method") != "prompts/get":
            return False
        error = {"code": -32001, "message": "closed", "data": {"account": ACCOUNT, "code": 402}}

        async def nothing() -> Any:
            return {"type": "http.request", "body": b""}

        await JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error})(scope, nothing, send)
        return True

    async with serving(intercepted(server, intercept)) as base:
        config = {"upstreams": {"billing": {"url": f"{base}/mcp", "headers": {"X-Account": str(ACCOUNT)}}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            with pytest.raises(MCPError) as refused:
                await client.get_prompt("billing__brief", {"topic": "z"})
            served = await client.read_resource("note://balance")
    assert refused.value.error.code == -32001
    assert refused.value.error.data == {"account": "[redacted]", "code": 402}
    assert served.contents


URL_KEY = "url-key-0123456789abcdef"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstreams_error_quoting_the_credential_in_its_url_reaches_its_client_without_it(
    mode: str,
) -> None:
    # Its URL's query value (and user or password) is as much the gateway's credential as a
    # header: an error quoting the URL it was asked at handed it to the client.
    server = FastMCP("keyed")

    @server.tool
    def lookup() -> str:
        raise ToolError(f"404 for /mcp?api_key={URL_KEY}")

    async with serving_upstream(server) as url:
        config = {"upstreams": {"keyed": {"url": f"{url}?api_key={URL_KEY}"}}}
        async with running_gateway(config) as gw, Client(gw.url, mode=mode) as client:  # type: ignore[arg-type]
            refused = await client.call_tool("keyed__lookup", {})
    assert refused.is_error
    assert refused.content == [types.TextContent(text="404 for /mcp?api_key=[redacted]")]


async def test_an_upstreams_error_quoting_the_credentials_in_its_arguments_reaches_its_client_without_them() -> (
    None
):
    # A stdio server's usage error quoting its command line: the log shows it masked
    # (``shown_command``), the client got it whole.
    github = "ghp_" + "A1b2C3d4" * 5
    args = [
        "--api-key",
        "flag-key-0123456789",
        "--token=inline-0123456789",
        github,
        "postgresql://app:db-pass-0123@db/x",
    ]
    upstream = python_upstream("faulty.py")
    upstream["args"] = [*upstream["args"], *args]
    async with running_gateway({"upstreams": {"faulty": upstream}}) as gw, Client(gw.url) as client:
        refused = await client.call_tool("faulty__usage", {})
        served = await client.call_tool("faulty__ping", {})
    said = refused.content[0]
    assert isinstance(said, types.TextContent)
    assert said.text == (
        "unexpected arguments: --api-key [redacted] --token=[redacted] [redacted] postgresql://app:[redacted]@db/x"
    )
    assert served.content == [types.TextContent(text="pong")]
