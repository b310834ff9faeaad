"""A client in a web page of another origin (a browser IDE), in a real headless Chromium: a page
at one of ``server.allowed_origins`` connects, calls a tool and reads its session id; any other
page's script is refused by the browser itself and reaches no upstream."""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastmcp import FastMCP
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from playwright.async_api import async_playwright
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from agent_gateway.cors import EXPOSED, MAX_AGE
from tests.support import running_gateway, serving, serving_upstream
from tests.ui.test_status_page import CHROMIUM, needs_chromium

TOKEN = "page-token-0123456789abcdef"
VERSION = HANDSHAKE_PROTOCOL_VERSIONS[-1]

# A handshake-era client in a few lines of the page's script: initialize, initialized, one call.
CLIENT = """
async ([url, token, version, text]) => {
  const headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"};
  if (token) headers["Authorization"] = "Bearer " + token;
  const read = async (answer) => {
    const body = await answer.text();
    const data = body.split("\\n").find((line) => line.startsWith("data:"));
    return JSON.parse(data ? data.slice(5) : body);
  };
  const post = (message) => fetch(url, {method: "POST", headers, body: JSON.stringify(message)});
  const opened = await post({jsonrpc: "2.0", id: 1, method: "initialize", params: {
    protocolVersion: version, capabilities: {}, clientInfo: {name: "page", version: "1"}}});
  if (opened.status !== 200) {
    return {status: opened.status, challenge: opened.headers.get("WWW-Authenticate")};
  }
  const session = opened.headers.get("Mcp-Session-Id");
  await read(opened);
  headers["Mcp-Session-Id"] = session;
  headers["MCP-Protocol-Version"] = version;
  await post({jsonrpc: "2.0", method: "notifications/initialized"});
  const called = await read(await post({jsonrpc: "2.0", id: 2, method: "tools/call",
    params: {name: "rec__note", arguments: {text}}}));
  return {status: 200, session, result: called.result.content[0].text};
}
"""


def recorder(heard: list[str]) -> FastMCP:
    server = FastMCP("rec")

    @server.tool
    def note(text: str) -> str:
        """Keep a note."""
        heard.append(text)
        return f"noted {text}"

    return server


def page_app() -> Starlette:
    return Starlette(routes=[Route("/", lambda _: HTMLResponse("<!doctype html><title>ide</title>"))])


def config(upstream_url: str, listed: str) -> dict[str, Any]:
    return {
        "upstreams": {"rec": {"url": upstream_url}},
        "server": {"allowed_origins": [listed]},
        "auth": {
            "mode": "bearer",
            "tokens": [{"name": "ide", "token": TOKEN, "policy": "ide"}],
            "policies": {"ide": {"tools": ["*"]}},
        },
    }


@needs_chromium
async def test_a_listed_pages_script_calls_a_tool_and_an_unlisted_pages_is_refused_by_the_browser() -> None:
    heard: list[str] = []
    async with (
        serving_upstream(recorder(heard)) as upstream_url,
        serving(page_app()) as listed,
        serving(page_app()) as unlisted,  # another port: another origin
        running_gateway(config(upstream_url, listed)) as gw,
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.goto(f"{listed}/")
            done = await page.evaluate(CLIENT, [gw.url, TOKEN, VERSION, "from the listed page"])
            assert done["status"] == 200, done
            assert done["result"] == "noted from the listed page"
            assert done["session"]  # the session header exposed to the page's script
            assert heard == ["from the listed page"]  # the call reached the upstream

            # No token: the page reads the 401 and where to authenticate.
            refused = await page.evaluate(CLIENT, [gw.url, "", VERSION, "unauthenticated"])
            assert refused["status"] == 401, refused
            assert (refused["challenge"] or "").startswith("Bearer"), refused

            other = await browser.new_page()
            await other.goto(f"{unlisted}/")
            failed = await other.evaluate(
                f"() => fetch({json.dumps(gw.url)}, {{method: 'POST', body: '{{}}', "
                "headers: {'Content-Type': 'application/json'}}).then(() => 'read', (e) => e.name)"
            )
            assert failed == "TypeError"  # the browser's refusal: the script sees no answer
        finally:
            await browser.close()
    assert heard == ["from the listed page"]


async def test_a_preflight_is_answered_for_a_listed_origin_only_and_no_origin_is_answered_without_one() -> (
    None
):
    heard: list[str] = []
    async with (
        serving_upstream(recorder(heard)) as upstream_url,
        running_gateway(config(upstream_url, "https://ide.example.com")) as gw,
        httpx.AsyncClient() as http,
    ):
        asked = {
            "Origin": "https://ide.example.com",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, mcp-session-id",
        }
        answer = await http.options(gw.url, headers=asked)
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == "https://ide.example.com"
        assert answer.headers["access-control-allow-headers"] == asked["Access-Control-Request-Headers"]
        assert answer.headers["access-control-max-age"] == str(MAX_AGE)
        assert "access-control-allow-credentials" not in answer.headers
        elsewhere = await http.options(gw.url, headers={**asked, "Origin": "https://evil.example.com"})
        assert elsewhere.status_code == 403  # the Origin check, before any CORS answer
        assert "access-control-allow-origin" not in elsewhere.headers
        # A request with no Origin (no browser) is answered as ever, unmarked.
        plain = await http.post(gw.url, json={}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert "access-control-allow-origin" not in plain.headers
        marked = await http.post(
            gw.url, json={}, headers={"Authorization": f"Bearer {TOKEN}", "Origin": "https://ide.example.com"}
        )
        assert marked.headers["access-control-allow-origin"] == "https://ide.example.com"
        assert set(marked.headers["access-control-expose-headers"].split(", ")) == set(EXPOSED)
    assert heard == []
