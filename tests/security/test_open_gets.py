"""GETs any client may send: ``/status`` and ``/metrics`` polled flat out cost the loop one
rendering a second, each client is sent at most its budget of bytes of them and of the status
page (``page_budget.py``), and a GET on the MCP path carrying ``Last-Event-ID`` with no event
store is answered as the GET it is, with no ERROR."""

from __future__ import annotations

import logging
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

import anyio
import httpx
import pytest
import yaml
from fastmcp import FastMCP
from mcp import Client
from pydantic import Field

from agent_gateway import page_budget
from agent_gateway.access import AccessControl
from agent_gateway.config import AuthConfig
from agent_gateway.page_budget import PAGE_BURST, SMALLEST
from agent_gateway.token_bucket import ByteBudget
from tests.replicas.test_store import opened
from tests.support import (
    child_process,
    free_port,
    gateway_env,
    ready,
    running_gateway,
    serving_upstream,
)

BOUND = 20.0
POLLERS = 20
POLLS = 5
"""Each poller's GETs of each page, one after another: 100 of each page in all."""


def _upstream() -> FastMCP:
    server = FastMCP("plain")

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


async def _poll(http: httpx.AsyncClient, answers: list[httpx.Response]) -> None:
    for _ in range(POLLS):
        for path in ("/status", "/metrics"):
            answers.append(await http.get(path))


async def test_status_and_metrics_are_rendered_at_most_once_a_second_however_many_poll_them(
    tmp_path: Path,
) -> None:
    # Each rendering is loop time every client waits for (/status was ~24 ms, /metrics ~6 ms):
    # four clients polling flat out made a bystander's calls a hundred times slower.
    port = free_port()
    log = tmp_path / "gateway.log"
    async with serving_upstream(_upstream()) as url:
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"server": {"port": port}, "upstreams": {"plain": {"url": url}}}))
        gateway = str(Path(sys.executable).parent / "agent-gateway")
        command = [gateway, "--log-level", "debug", "serve", "-c", str(config)]
        async with (
            child_process(command, gateway_env(), log),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=BOUND) as http,
        ):
            await ready(port)
            answers: list[httpx.Response] = []
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(POLLERS):
                    tg.start_soon(_poll, http, answers)
            span = time.monotonic() - started
            renders = Counter(re.findall(r" (/status|/metrics) rendered in ", log.read_text()))
            # A rendering is at most a second old: a session opened now is on the page soon.
            async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy"):
                with anyio.fail_after(BOUND):
                    while (await http.get("/status")).json()["sessions"]["live"] != 1:
                        await anyio.sleep(0.05)
    assert [a.status_code for a in answers] == [200] * (2 * POLLERS * POLLS)
    assert {a.headers["content-type"].split(";")[0] for a in answers} == {"application/json", "text/plain"}
    # Renderings at least a second apart, all within the polling: at most span + 1 of them.
    assert 1 <= renders["/status"] <= span + 1, (renders, span)
    assert 1 <= renders["/metrics"] <= span + 1, (renders, span)


@asynccontextmanager
async def uvicorns_records(caplog: pytest.LogCaptureFixture) -> AsyncIterator[None]:
    """uvicorn's records (its "ASGI callable returned without starting response." among them)
    in ``caplog`` too: its loggers stop at their own handler, set as each server starts."""
    uvicorns = logging.getLogger("uvicorn")
    uvicorns.addHandler(caplog.handler)
    try:
        yield
    finally:
        uvicorns.removeHandler(caplog.handler)


async def test_a_get_with_last_event_id_and_no_event_store_opens_the_stream_as_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The SDK answered nothing without a store: a bare 500 and "ERROR: ASGI callable returned
    # without starting response." for every such GET of any client.
    caplog.set_level(logging.DEBUG)
    async with (
        serving_upstream(_upstream()) as url,
        running_gateway({"upstreams": {"plain": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
        uvicorns_records(caplog),
    ):
        session = {k.lower(): v for k, v in (await opened(http, gw.url)).items()}
        resuming = {"accept": "text/event-stream", "last-event-id": "evt-1"} | session
        async with http.stream("GET", gw.url, headers=resuming) as stream:
            streamed = (stream.status_code, stream.headers["content-type"])
            second = await http.get(gw.url, headers=resuming | {"last-event-id": "evt-2"})
        await http.delete(gw.url, headers=session)
    assert streamed == (200, "text/event-stream")
    # A second one is refused as a second GET without the header is: one stream per session.
    assert second.status_code == 409
    assert second.json()["error"]["message"] == "Conflict: Only one SSE stream is allowed per session"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def _poll_page(http: httpx.AsyncClient, url: str, answers: list[httpx.Response]) -> None:
    for _ in range(POLLS):
        for query in ("", "?part=live&catalog=stale"):  # a stale version: the catalog is sent
            answers.append(await http.get(f"{url}/{query}"))


async def test_the_status_page_polled_flat_out_is_rendered_once_a_second_its_catalog_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every GET of the page rendered it whole, its catalog (every tool with its schema) too,
    # in the loop every client waits on; a client asking for a stale catalog version got it
    # rendered anew each time. Neither is rate limited.
    caplog.set_level(logging.DEBUG, logger="agent_gateway.ui.page")  # the catalog's line
    caplog.set_level(logging.DEBUG, logger="agent_gateway.rendered")  # the live sections' line
    async with (
        serving_upstream(_upstream()) as url,
        running_gateway({"upstreams": {"plain": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        answers: list[httpx.Response] = []
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(POLLERS):
                tg.start_soon(_poll_page, http, gw.base, answers)
        span = time.monotonic() - started
        renders = Counter(
            r.getMessage().split(" rendered")[0] for r in caplog.records if "rendered in" in r.getMessage()
        )
        # The live sections at most a second old: a session opened now is on the page soon.
        async with Client(gw.url, mode="legacy"):
            with anyio.fail_after(BOUND):
                while "<td>anonymous" not in (await http.get(f"{gw.base}/?part=live")).text:
                    await anyio.sleep(0.05)
    assert [a.status_code for a in answers] == [200] * (2 * POLLERS * POLLS)
    assert all("plain__echo" in a.text for a in answers)  # the catalog in every answer asked for
    assert renders["status page catalog"] == 1, renders
    assert 1 <= renders["status page sections"] <= span + 1, (renders, span)


async def test_a_status_page_query_string_of_thousands_of_parameters_is_refused_unread() -> None:
    # Starlette parsed the whole query string of every GET of the page: 16,000 parameters (64 KB)
    # held the event loop 9.5 ms a request, from anyone the page lets in (no auth here).
    padding = "&".join(f"a{n}=1" for n in range(6_000))
    async with running_gateway({"upstreams": {}}) as gw, httpx.AsyncClient(timeout=BOUND) as http:
        refused = await http.get(f"{gw.base}/?part=live&catalog=1&{padding}")
        served = await http.get(f"{gw.base}/?part=live&catalog=1")
    assert refused.status_code == 414
    assert "a query string over 1024 bytes" in refused.text
    assert served.status_code == 200


Wide = Annotated[str, Field(description="a field of the record " + "x" * 20_000)]
WIDE_TOOLS = 64
"""Tools whose schemas the page shows 16 KiB of each: a page of about a megabyte."""


def _wide_upstream() -> FastMCP:
    server = FastMCP("wide")

    def wide(record: Wide) -> str:
        return record

    for n in range(WIDE_TOOLS):
        server.tool(wide, name=f"wide_{n}")

    @server.tool
    def echo(text: str) -> str:
        return text

    return server


async def _call_meanwhile(client: Client, done: anyio.Event, texts: list[str]) -> None:
    while not done.is_set():
        texts.append((await client.call_tool("wide__echo", {"text": "hi"})).content[0].text)  # type: ignore[union-attr]


async def test_a_client_polling_the_status_page_flat_out_is_refused_past_its_budget_and_others_are_served() -> (
    None
):
    # Each answer is bytes the loop writes, and nothing bounded how often one client asked: four
    # pollers of a 10,000-tool page (18 MB) made a bystander's calls 3-4x slower at p50, 20x at
    # p99 (bench/status_polling.py). Now 1 MiB a second a client (32 s of it at once), by default;
    # here 64 KiB, so that pages of 100 rows (each charged 64 KiB at least) are refused soon.
    rate = 2**16
    local = httpx.AsyncHTTPTransport(local_address="127.0.0.2")  # another client: no auth, by address
    async with (
        serving_upstream(_wide_upstream()) as url,
        running_gateway(
            {"upstreams": {"wide": {"url": url}}, "server": {"page_bytes_per_second": rate}}
        ) as gw,
        Client(gw.url, mode="legacy") as bystander,
        httpx.AsyncClient(base_url=gw.base, timeout=BOUND, transport=local) as poller,
        httpx.AsyncClient(base_url=gw.base, timeout=BOUND) as person,
    ):
        size = max(len((await person.get("/?part=live&catalog=stale")).content), SMALLEST)  # as charged
        polls = 3 * PAGE_BURST * rate // size  # three times what the burst holds: time for a refusal
        answers: list[httpx.Response] = []
        texts: list[str] = []
        others: dict[str, int] = {}
        done = anyio.Event()
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_call_meanwhile, bystander, done, texts)
            for _ in range(polls):
                answers.append(await poller.get("/?part=live&catalog=stale"))
                if [a.status_code for a in answers].count(429) == 3:
                    break
            # The load balancers' GETs are not in its budget.
            others.update({path: (await poller.get(path)).status_code for path in ("/healthz", "/readyz")})
            done.set()
        span = time.monotonic() - started
        refreshed = await person.get("/?part=live&catalog=stale")
        during = len(texts)
        texts.append((await bystander.call_tool("wide__echo", {"text": "hi"})).content[0].text)  # type: ignore[union-attr]
    statuses = [a.status_code for a in answers]
    assert statuses.count(429) == 3, statuses
    refused = answers[statuses.index(429)]
    assert 1 <= int(refused.headers["retry-after"]) <= 2, refused.headers
    assert "server.page_bytes_per_second" in refused.text
    sent = statuses.count(200) * size  # as charged
    assert sent <= (PAGE_BURST + span) * rate + size, (sent, span)  # the burst, what came since, one page
    assert others == {"/healthz": 200, "/readyz": 200}
    assert refreshed.status_code == 200  # another client's budget is its own
    assert "wide__wide_0" in refreshed.text
    assert during >= 1  # the bystander's calls served throughout, and after
    assert set(texts) == {"hi"}


def test_a_page_larger_than_the_burst_is_served_and_then_paid_for() -> None:
    now = [0.0]
    budget = ByteBudget(100, 1_000, lambda: now[0])
    assert budget.wait() is None
    budget.spend(5_000)  # more than the burst: served whole, 4,000 owed
    assert budget.wait() == 40.01
    now[0] = 40.0
    assert budget.wait() == 0.01
    now[0] = 40.02
    assert budget.wait() is None
    now[0] = 1_000.0
    budget.spend(1_000)  # never more than the burst saved up
    assert budget.wait() == 0.01


async def test_one_budget_is_spent_on_the_page_status_and_metrics_and_a_refusal_is_held_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(page_budget, "HOLD", 0.01)
    now = [0.0]
    budgets = page_budget.PageBudgets(AccessControl(AuthConfig()), 1_000, lambda: now[0])
    poller, other = {"client": ("127.0.0.2", 1)}, {"client": ("127.0.0.3", 1)}
    assert await budgets.refusal(poller, "the status page") is None
    budgets.charge(poller, 100_000)  # its burst (32 s) and 68 s more
    refused = await budgets.refusal(poller, "/status")
    assert refused is not None
    assert refused[1] == 68  # 68 s and a byte, less the hold, in whole seconds
    assert "1000 bytes a second (server.page_bytes_per_second)" in refused[0]
    assert await budgets.refusal(other, "/metrics") is None  # another client's is its own
    now[0] = 68.01
    assert await budgets.refusal(poller, "/metrics") is None
    budgets.charge(poller, 10)  # a small answer costs what a request does
    now[0] = 68.01 + page_budget.SMALLEST / 1_000 - 0.5  # half a second short of it
    assert await budgets.refusal(poller, "/status") is not None
