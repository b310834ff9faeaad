"""The status page at ``GET /`` in a real headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
import httpx
import httpx2
import jwt
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import Field

from agent_gateway import rendered
from agent_gateway.ui import catalog
from agent_gateway.ui.static import REFRESH_MS
from agent_gateway.upstreams.connection import REFRESH_SPACING_MAX, UpstreamState
from tests.support import RunningGateway, python_upstream, running_gateway, serving_upstream
from tests.test_search_mode import tracker_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOWN_NAMES = "cells => cells.map(c => c.textContent)"
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
BIDI = "\u202egpj.exe\u2066"
"""Shown as it is, what follows in its cell would read reversed (``exe.jpg``)."""
REFRESH = REFRESH_MS / 1000
needs_chromium = pytest.mark.skipif(
    # In CI scripts/setup has installed it: a missing Chromium there fails the test, not skips it.
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Chromium is not installed (scripts/setup installs it as root on Debian)",
)


def alpha_server() -> FastMCP:
    server = FastMCP("alpha")

    @server.tool(description=f"Echo the text back. {HOSTILE}")
    def echo(text: str) -> str:
        return text

    @server.tool
    def weather(city: str) -> str:
        """Today's weather in a city."""
        return f"sunny in {city}"

    @server.tool(description=f"Lists files.{BIDI}")
    def files() -> str:
        return "none"

    return server


def config(alpha_url: str) -> dict[str, Any]:
    return {
        "upstreams": {
            # Retries far apart: once killed, it stays down for the length of the test.
            "counter": python_upstream("counter.py", retry={"initial_delay": 60, "max_delay": 60}),
            "alpha": {"url": alpha_url},
            "ghost": {"command": "no-such-mcp-server"},
        },
        "agent": {"memory": {"store": "memory"}},
    }


@asynccontextmanager
async def example() -> AsyncIterator[RunningGateway]:
    async with serving_upstream(alpha_server()) as url, running_gateway(config(url)) as gw:
        yield gw


async def test_the_page_is_off_with_ui_false_and_behind_auth_like_status() -> None:
    token, other = "page-token-0123456789abcdef", "ci-token-0123456789abcdef"
    auth = {
        "mode": "bearer",
        "tokens": [
            {"name": "ops", "token": token, "policy": "ops"},
            {"name": "ci", "token": other, "policy": "ci"},
        ],
        "policies": {"ops": {"admin": True}, "ci": {"tools": ["*"]}},
    }
    async with running_gateway({"upstreams": {}, "auth": auth}) as gw, httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.base}/")).status_code == 401
        for path in ("/", "/status"):  # a client, but not an admin one: refused alike
            refused = await http.get(f"{gw.base}{path}", headers={"Authorization": f"Bearer {other}"})
            assert refused.status_code == 403, path
            assert "admin: true" in refused.text
        page = await http.get(f"{gw.base}/", headers={"Authorization": f"Bearer {token}"})
        assert page.status_code == 200
        assert "default-src 'none'" in page.headers["content-security-policy"]
    async with running_gateway({"upstreams": {}, "server": {"ui": False}}) as gw, httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.base}/")).status_code == 404
        assert (await http.get(f"{gw.base}/status")).status_code == 200


@needs_chromium
async def test_in_a_browser_the_page_shows_filters_and_follows_the_gateway() -> None:
    from playwright.async_api import async_playwright

    who = types.Implementation(name=f"ide{BIDI}", version="1")
    async with (
        example() as gw,
        Client(gw.url, mode="legacy", client_info=who) as client,
        async_playwright() as pw,
    ):
        pid = int((await client.call_tool("counter__pid", {})).content[0].text)  # type: ignore[union-attr]
        await client.call_tool("alpha__echo", {"text": 42})  # an error, highlighted
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1300, "height": 1000})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            await page.goto(f"{gw.base}/")

            names = await page.eval_on_selector_all(
                "#upstreams tr[data-name]", "rows => rows.map(r => r.dataset.name)"
            )
            assert sorted(names) == ["alpha", "counter", "ghost"]
            assert await page.get_attribute('tr[data-name="ghost"]', "class") == "upstream state-down"
            assert await page.title() == "agent-gateway"  # the hostile description stayed text
            assert HOSTILE in await page.inner_text("#catalog")
            shown = await page.inner_text("body")  # hidden characters as their escapes
            assert "Lists files.\\u202egpj.exe\\u2066" in shown
            assert "ide\\u202egpj.exe\\u2066" in shown
            assert "\u202e" not in shown
            failed = await page.inner_text("#calls tr.failed")
            assert "alpha__echo" in failed
            assert "tool_error" in failed

            await page.fill("#search", "Weather")  # the gateway finds it: the page holds 100 rows at most
            await page.wait_for_selector('#catalog[data-query="weather"]', timeout=10_000)
            visible = await page.eval_on_selector_all("#catalog tr.tool code", SHOWN_NAMES)
            assert visible == ["alpha__weather"]
            listed = len(gw.gateway.catalog.snapshot.tools) + 1  # ask_agent's row first
            assert await page.inner_text("#shown") == f"1 matching weather; {listed} tools in the catalog"

            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(20):
                while gw.gateway.pool.get("counter").state != UpstreamState.DOWN:
                    await anyio.sleep(0.05)
            # Down at the gateway: red on the page by its next refresh.
            await page.wait_for_selector('tr[data-name="counter"].state-down', timeout=(REFRESH + 3) * 1000)
            await page.wait_for_selector('#catalog[data-query="weather"]', timeout=(REFRESH + 3) * 1000)
            still = await page.eval_on_selector_all("#catalog tr.tool code", SHOWN_NAMES)
            assert still == ["alpha__weather"]  # the refresh kept the search
            await page.click('details[data-tool="alpha__weather"] summary')  # its schema, fetched
            await page.wait_for_function(
                "() => document.querySelector('details[data-tool=\"alpha__weather\"] pre').textContent.includes('city')",
                timeout=10_000,
            )
            # Past its 8th word a search's words are not matched: its answer is shown all the same
            # (its section's data-query, what the gateway read, was compared with the box's 9).
            await page.fill("#search", "city today's weather in a alpha__weather alpha city. unmatched")
            await page.wait_for_selector(
                '#catalog[data-query="city today\'s weather in a alpha__weather alpha city."]', timeout=10_000
            )
            assert await page.eval_on_selector_all("#catalog tr.tool code", SHOWN_NAMES) == ["alpha__weather"]
            if target := os.environ.get("AGW_SCREENSHOT"):
                await page.fill("#search", "")
                await page.wait_for_selector('#catalog[data-query=""]', timeout=10_000)
                await page.screenshot(path=target, full_page=True)
            assert problems == []
        finally:
            await browser.close()


Fat = Annotated[str, Field(description="property " + "\u00e9" * 300_000)]


def hoarder_server() -> FastMCP:
    """A tool whose description (1 MB) and input schema (about 600 KB) fill pages."""
    server = FastMCP("hoarder")

    @server.tool(description="Hunts treasure. " + "word " * 200_000)
    def hunt(where: Fat) -> str:
        return where

    @server.tool
    def steady() -> str:
        return "steady"

    return server


async def test_a_tool_of_a_megabyte_costs_the_page_a_bounded_share_and_is_still_found() -> None:
    # Before, its description went into the page whole (the search's text) and its schema too:
    # 2 MB of every load of the page, for one tool.
    async with (
        serving_upstream(hoarder_server()) as url,
        running_gateway({"upstreams": {"hoarder": {"url": url}}}) as gw,
        httpx.AsyncClient() as http,
        Client(gw.url, mode="legacy") as bystander,
    ):
        page = (await http.get(f"{gw.base}/")).text
        assert len(page) < 16_000, len(page)  # its first line 200 characters, no schema
        schema = await http.get(f"{gw.base}/?part=schema&tool=hoarder__hunt")  # when its row is opened
        assert schema.headers["content-type"] == "text/plain; charset=utf-8"  # an upstream's, never markup
        assert len(schema.text) < 17_000, len(schema.text)  # 16 KiB of it, and how much more there was
        assert schema.text.endswith("more characters)")
        assert (await http.get(f"{gw.base}/?part=schema&tool=hoarder__none")).status_code == 404
        found = (await http.get(f"{gw.base}/?part=catalog&q=treasure+WORD")).text  # its first 1,000 searched
        assert "<code>hoarder__hunt</code>" in found
        assert "<code>hoarder__steady</code>" not in found
        part = (await http.get(f"{gw.base}/?part=live&catalog=none")).text
        assert len(part) < len(page)
        assert (await bystander.call_tool("hoarder__steady", {})).content[0].text == "steady"  # type: ignore[union-attr]


async def test_the_page_is_encoded_once_a_rendering_however_many_ask_each_with_its_nonce(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, each request joined and encoded the whole page anew (at 10,000 tools, 13 MB): four
    # clients polling it held a bystander's calls 0.2-0.4 s (bench/README.md).
    monkeypatch.setattr(rendered, "PAGE_INTERVAL", 3600.0)  # one rendering for the whole test
    caplog.set_level(logging.DEBUG, logger="agent_gateway.ui.page")
    async with example() as gw, httpx.AsyncClient() as http:
        answers = [await http.get(f"{gw.base}/") for _ in range(10)]
    nonces = {a.headers["content-security-policy"].split("'nonce-")[1].split("'")[0] for a in answers}
    assert len(nonces) == 10
    for answer in answers:
        nonce = answer.headers["content-security-policy"].split("'nonce-")[1].split("'")[0]
        assert answer.text.count(f'nonce="{nonce}"') == 2  # its style and its script
    assert len({a.text.replace(n, "") for a, n in zip(answers, nonces, strict=False)}) <= 10
    encoded = [r for r in caplog.records if r.getMessage().startswith("status page encoded")]
    assert len(encoded) == 1, [r.getMessage() for r in encoded]


async def test_a_catalog_changing_faster_than_the_page_renders_is_rendered_at_its_pace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Once per catalog version, upstreams changing their lists each second made a client
    # polling the page render the whole catalog at each change (10,000 tools: a bystander's
    # p99 85 to 361 ms). Now at most once per PAGE_INTERVAL (and a tenth of the loop's time).
    monkeypatch.setattr(rendered, "PAGE_INTERVAL", 3600.0)  # no second rendering in the test
    caplog.set_level(logging.DEBUG, logger="agent_gateway.ui.page")
    async with (
        serving_upstream(tracker_server([])) as url,
        running_gateway({"upstreams": {"tracker": {"url": url}}, "search": {"mode": "off"}}) as gw,
        Client(gw.url, mode="legacy") as client,
        httpx.AsyncClient() as http,
    ):
        pages = []
        for n in range(4):
            before = gw.gateway.catalog.snapshot.version
            await client.call_tool("tracker__add_tool", {"name": f"added_{n}", "description": "new"})
            with anyio.fail_after(REFRESH_SPACING_MAX + 10):  # a loaded machine's 1.2 s listing: 11 s
                while gw.gateway.catalog.snapshot.version == before:
                    await anyio.sleep(0.01)
            pages.append((await http.get(f"{gw.base}/?part=live&catalog=stale")).text)
        renders = [r for r in caplog.records if r.getMessage().startswith("status page catalog rendered")]
        assert len(renders) == 1, len(renders)
        assert all("tracker__close_issue" in page for page in pages)  # the catalog as last rendered
        monkeypatch.setattr(rendered, "PAGE_INTERVAL", 0.0)  # its pace: the newest is shown soon
        with anyio.fail_after(10):
            while "tracker__added_3" not in (await http.get(f"{gw.base}/?part=live&catalog=stale")).text:
                await anyio.sleep(0.05)


async def test_a_change_of_one_upstream_makes_only_its_own_rows_of_the_catalog_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before, each rendering made every tool's row: one upstream changing its list each second
    # among 10,000 tools of others held a bystander's calls up to 0.4-0.6 s, now 0.2 s.
    caplog.set_level(logging.DEBUG, logger="agent_gateway.ui.page")
    async with (
        serving_upstream(tracker_server([])) as url,
        serving_upstream(alpha_server()) as other,
        running_gateway({"upstreams": {"tracker": {"url": url}, "alpha": {"url": other}}}) as gw,
        Client(gw.url, mode="legacy") as client,
        httpx.AsyncClient() as http,
    ):
        await http.get(f"{gw.base}/?part=live&catalog=stale")
        before = gw.gateway.catalog.snapshot.version
        await client.call_tool("tracker__add_tool", {"name": "added", "description": "new"})
        with anyio.fail_after(10):
            while gw.gateway.catalog.snapshot.version == before:
                await anyio.sleep(0.01)
        with anyio.fail_after(10):  # rendered again once PAGE_INTERVAL has passed
            while "tracker__added" not in (await http.get(f"{gw.base}/?part=live&catalog=stale")).text:
                await anyio.sleep(0.05)
        tracker = sum(origin.upstream == "tracker" for origin in gw.gateway.catalog.snapshot.tools.values())
        alpha = sum(origin.upstream == "alpha" for origin in gw.gateway.catalog.snapshot.tools.values())
    made = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("status page catalog rendered")
    ]
    assert made[0].endswith(f"({tracker - 1 + alpha} of its rows made)")  # the first: every row
    assert made[-1].endswith(f"({tracker} of its rows made)"), made  # then tracker's only
    assert alpha == 3


async def test_a_jwt_subject_of_forty_thousand_characters_is_shown_cut_on_the_page() -> None:
    # A subject is the issuer's to choose, and some let a client choose its own (a service
    # account's name): shown whole in each of its sessions', calls' and runs' rows, and in the
    # summary, 40,000 characters were 200 KB of every load of the page for one session.
    secret = "a-shared-secret-of-at-least-32-chars!"
    long = "svc-" + "x" * 40_000

    def bearer(subject: str) -> dict[str, str]:
        claims = {"sub": subject, "aud": "gw", "exp": int(time.time()) + 300}
        return {"Authorization": f"Bearer {jwt.encode(claims, secret, algorithm='HS256')}"}

    auth = {
        "mode": "jwt",
        "jwt": {"secret": secret, "algorithm": "HS256", "audience": "gw"},
        "subjects": {"ops": "ops"},
        "policies": {"ops": {"admin": True}},
    }
    async with (
        serving_upstream(alpha_server()) as url,
        running_gateway({"upstreams": {"alpha": {"url": url}}, "auth": auth}) as gw,
        httpx2.AsyncClient(headers=bearer(long)) as http,
        Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as hoarder,  # type: ignore[arg-type]
        httpx.AsyncClient(headers=bearer("ops")) as admin,
    ):
        await hoarder.call_tool("alpha__weather", {"city": "Oslo"})
        page = (await admin.get(f"{gw.base}/")).text
        assert len(page) < 40_000, len(page)
        assert f"svc-{'x' * 60}… (40,004 characters)" in page
        assert '"sessions"' in (await admin.get(f"{gw.base}/status")).text  # no subject there


WEATHER_CALLS = "n => [...document.querySelectorAll('#calls tr.call code')].filter(c => c.textContent === 'alpha__weather').length === n"
BUDGET = 8192
"""Bytes of pages a second each client may be sent in the next test (its burst: 32 times that)."""


async def _until_refused(http: httpx.AsyncClient, path: str) -> int:
    """GETs of ``path`` one after another until one is refused (429); how many were served."""
    with anyio.fail_after(20):  # 32 s of its budget are 4 answers of 64 KiB at least
        served = 0
        while (await http.get(path)).status_code != 429:
            served += 1
    return served


async def _spending(http: httpx.AsyncClient, path: str) -> None:
    """GETs of ``path`` one after another, until cancelled."""
    while True:
        await http.get(path)


async def test_in_a_browser_the_page_refreshes_while_a_poller_is_refused_and_again_after_its_own_refusal() -> (
    None
):
    # A client polling the page flat out is refused past its budget of bytes (page_budget.py);
    # a person's page keeps refreshing meanwhile, and, refused itself, refreshes again once the
    # budget has come back (the script waits for Retry-After).
    from playwright.async_api import async_playwright

    local = httpx.AsyncHTTPTransport(local_address="127.0.0.2")  # no auth: a client by address
    async with serving_upstream(alpha_server()) as url:
        data = {**config(url), "server": {"page_bytes_per_second": BUDGET}}
        async with (
            running_gateway(data) as gw,
            Client(gw.url, mode="legacy") as client,
            httpx.AsyncClient(base_url=gw.base, transport=local) as poller,
            httpx.AsyncClient(base_url=gw.base) as person,  # the browser's address: its budget
            async_playwright() as pw,
        ):
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = await browser.new_page()
                problems: list[str] = []
                page.on(
                    "console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None
                )
                page.on("pageerror", lambda exc: problems.append(str(exc)))
                await page.goto(f"{gw.base}/")
                assert await _until_refused(poller, "/?part=live&catalog=stale") >= 1
                await client.call_tool("alpha__weather", {"city": "Oslo"})
                await page.wait_for_function(WEATHER_CALLS, arg=1, timeout=(REFRESH + 10) * 1000)
                assert await page.is_hidden("#stale")

                # The browser's own budget kept spent (each answer served takes 64 KiB, 8 s of it)
                # until its page has been refused.
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_spending, person, "/?part=live&catalog=stale")
                    await page.wait_for_selector("#stale", state="visible", timeout=(REFRESH + 10) * 1000)
                    tg.cancel_scope.cancel()
                await client.call_tool("alpha__weather", {"city": "Bergen"})
                await page.wait_for_selector("#stale", state="hidden", timeout=60_000)
                await page.wait_for_function(WEATHER_CALLS, arg=2, timeout=(REFRESH + 10) * 1000)
            finally:
                await browser.close()
    assert [p for p in problems if "status of 429" not in p] == []


def bulk_server(tools: int) -> FastMCP:
    """``tools`` tools, each a row of the page: ``tool_0`` … ``tool_{tools - 1}``."""
    server = FastMCP("bulk")
    for n in range(tools):
        server.tool(lambda: "ok", name=f"tool_{n}", description=f"Bulk tool number {n}.")
    return server


async def test_a_large_catalog_is_a_page_of_its_first_rows_and_the_search_finds_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every tool's row went into every load of the page, for the search box to filter them in
    # the browser: 10,000 tools were an 18 MB page. Now the page holds the first SHOWN, the
    # gateway answers the search, and a search is charged for the tools it looked through.
    async with (
        serving_upstream(bulk_server(250)) as url,
        running_gateway(
            {"upstreams": {"bulk": {"url": url}}, "server": {"page_bytes_per_second": BUDGET}}
        ) as gw,
        httpx.AsyncClient(base_url=gw.base) as http,
        httpx.AsyncClient(
            base_url=gw.base, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        ) as lister,
        httpx.AsyncClient(
            base_url=gw.base, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.3")
        ) as finder,
    ):
        listed = len(gw.gateway.catalog.snapshot.tools) + 1  # ask_agent's row first
        page = (await http.get("/")).text
        assert page.count('<tr class="tool">') == catalog.SHOWN
        assert f"100 of {listed} tools; search to find the others" in page
        assert "<code>bulk__tool_230</code>" not in page
        found = (await http.get("/?part=catalog&q=NUMBER+230.")).text
        assert found.count('<tr class="tool">') == 1
        assert "<code>bulk__tool_230</code>" in found
        assert f"1 matching <b>number 230.</b>; {listed} tools in the catalog" in found
        many = (await http.get("/?part=catalog&q=number")).text  # all 250: the first 100 shown
        assert many.count('<tr class="tool">') == catalog.SHOWN
        assert "100 matching <b>number</b>, and more: refine the search;" in many
        # tool_24 and tool_240 … tool_249, the last row:
        last = (await http.get("/?part=catalog&q=tool_24")).text
        assert "11 matching <b>tool_24</b>;" in last
        assert "<code>bulk__tool_249</code>" in last
        live = (await http.get("/?part=live&catalog=stale&q=number+230.")).text  # a refresh keeps it
        # The words as read are what the refresh sends again: shown with their escapes, they
        # were sent as "\u202e", a search for those 6 characters (none found).
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.4")  # a budget of its own
        async with httpx.AsyncClient(base_url=gw.base, transport=other) as reader:
            hidden = (await reader.get("/?part=catalog&q=NUMBER+%E2%80%AE")).text
        assert 'data-query="number \u202e"' in hidden
        assert "<b>number \\u202e</b>" in hidden
        assert live.count('<tr class="tool">') == 1
        # Its first view is charged as any page is; a search by the tools it looked through.
        monkeypatch.setattr(catalog, "LOOKED_AT", 1024)  # 251 rows: a search costs 257,024 bytes
        assert await _until_refused(finder, "/?part=catalog&q=none-of-them") < await _until_refused(
            lister, "/?part=catalog&q="
        )


EIGHT = [f"part{k}x" for k in range(8)]


def crafted_server(tools: int) -> FastMCP:
    """``tools`` tools each holding 7 of ``EIGHT``'s words, the last all 8: every word in most
    rows, all of them in one (an upstream's descriptions are its own to choose)."""
    server = FastMCP("crafted")
    for n in range(tools):
        held = EIGHT if n == tools - 1 else [w for k, w in enumerate(EIGHT) if k != n % 8]
        server.tool(lambda: "ok", name=f"tool_{n}", description=" ".join(held))
    return server


async def test_a_search_every_row_nearly_matches_is_worked_on_in_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Checked in one step, every row holding its rarest word, 10,000 such tools held the event
    # loop 35-50 ms a search (bench/README.md); now in steps of about a megabyte's scan each.
    caplog.set_level(logging.DEBUG, logger="agent_gateway.ui.catalog")
    async with (
        serving_upstream(crafted_server(1200)) as url,
        running_gateway({"upstreams": {"crafted": {"url": url}}}) as gw,
        httpx.AsyncClient(base_url=gw.base) as http,
        Client(gw.url, mode="legacy") as bystander,
    ):
        found = (await http.get("/?part=catalog&q=" + "+".join(EIGHT))).text
        assert found.count('<tr class="tool">') == 1
        assert "<code>crafted__tool_1199</code>" in found
        steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("status page search")]
        assert steps == ["status page search of 8 words took 5 steps"], steps
        twice = (await http.get("/?part=catalog&q=tool_1199+TOOL_1199")).text  # a word twice: matched once
        assert 'data-query="tool_1199"' in twice
        assert "<code>crafted__tool_1199</code>" in twice
        assert (await bystander.call_tool("crafted__tool_0", {})).content[0].text == "ok"  # type: ignore[union-attr]
