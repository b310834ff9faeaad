"""An upstream sending notifications faster than its ``notification_rate`` is read more
slowly (``upstreams/pace.py``): its writes wait in its pipe, every line still reaches its
client in order, and the other upstreams' clients are served meanwhile. Before, each line was
read as fast as the upstream wrote it, and the SDK started a task for each: 300,000 small
lines cost the gateway 20 s of CPU, and every client's calls waited behind them. And its lines
no call owns, which go to every listening client, are passed on at most 100 a second."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client

from agent_gateway.downstream import broadcast
from agent_gateway.upstreams.pace import MAX_ASKED, WARN_EVERY
from tests.faults.harness import text_of
from tests.support import SERVERS, gateway_process, running_gateway, serving_upstream
from tests.test_responses import upstream as steps_upstream

RATE = 200
"""The flooding upstream's ``notification_rate`` (a second's worth may come at once)."""
LINES = 1000
SIZE = 8000
BUFFERED = 100
"""Lines the upstream may write beyond what the gateway has read: its pipe (64 KiB), the
buffer of the event loop's transport reading it (128 KiB) and the chunk the reader holds
(64 KiB): about 32 at this size."""
BOUND = 60.0


async def test_an_upstream_over_its_notification_rate_waits_in_its_pipe_and_loses_nothing() -> None:
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")], "notification_rate": RATE}
    calm = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}
    heard: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))

    served_meanwhile = 0
    async with (
        running_gateway({"upstreams": {"noisy": noisy, "calm": calm}}) as gw,
        Client(gw.url, mode="legacy", logging_callback=on_log) as flooded,
        Client(gw.url, mode="legacy") as bystander,
    ):
        flooding = anyio.Event()

        async def flood() -> None:
            arguments = {"lines": LINES, "size": SIZE, "during": True}
            assert text_of(await flooded.call_tool("noisy__flood", arguments)) == "flood"
            flooding.set()

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(flood)
                while not flooding.is_set():
                    assert text_of(await bystander.call_tool("calm__echo", {"text": "hi"})) == "hi"
                    served_meanwhile += 1 if not flooding.is_set() else 0
    # Every line, in the order written: the upstream was slowed, nothing was dropped.
    assert [int(line.split()[0]) for line in heard] == list(range(LINES))
    # It could not write them faster than the gateway read them: all but a second's worth
    # and what its pipe held waited for the gateway's reads, RATE a second.
    stamps = [float(line.split()[1]) for line in heard]
    assert stamps[-1] - stamps[0] >= (LINES - RATE - BUFFERED) / RATE
    assert served_meanwhile > 0  # another upstream's client was served throughout


async def test_notifications_of_a_method_mcp_does_not_define_are_dropped_where_they_are_read(
    tmp_path: Path,
) -> None:
    """Nothing reads them (the SDK's session dropped each, after a task, a parse and a debug
    line: an upstream sending them without end cost the gateway 115 ms of CPU a thousand at its
    pace, 28 now); they still count against the upstream's rate, and are counted as dropped."""
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")], "notification_rate": RATE}
    heard: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))

    async with (
        gateway_process({"upstreams": {"noisy": noisy}}, tmp_path) as base,  # its /metrics served
        Client(f"{base}/mcp", mode="legacy", logging_callback=on_log) as client,
        httpx.AsyncClient() as http,
    ):
        with anyio.fail_after(BOUND):
            vendor = {"lines": LINES, "size": 40, "during": True, "method": "notifications/x-vendor/tick"}
            assert text_of(await client.call_tool("noisy__flood", vendor)) == "flood"
            logged = {"lines": 5, "size": 40, "during": True}
            assert text_of(await client.call_tool("noisy__flood", logged)) == "flood"
            metrics = (await http.get(f"{base}/metrics")).text
    family = "agent_gateway_notifications_dropped_total{"
    counted = [line for line in metrics.splitlines() if line.startswith(family) and 'kind="unknown"' in line]
    assert [line.rsplit(" ", 1)[1] for line in counted if 'why="method"' in line] == [f"{LINES}.0"], counted
    assert [int(line.split()[0]) for line in heard] == list(range(5))  # the defined ones passed on


async def test_a_forwarded_calls_progress_reports_are_read_at_the_upstreams_rate() -> None:
    """A modern-era upstream's reports on a call's own stream count against its rate too."""
    reports = 3 * RATE
    received: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(time.monotonic())

    async with (
        serving_upstream(steps_upstream()) as url,
        running_gateway({"upstreams": {"up": {"url": url, "notification_rate": RATE}}}) as gw,
        Client(gw.url) as client,
    ):
        with anyio.fail_after(BOUND):
            result = await client.call_tool("up__steps", {"count": reports}, progress_callback=on_progress)
    assert text_of(result) == f"{reports} steps"
    assert len(received) == reports
    # A second's worth at once, the rest RATE a second (the upstream wrote them all at once).
    assert received[-1] - received[0] >= (reports - RATE) / RATE * 0.9


async def test_lines_no_call_owns_are_passed_on_at_most_a_hundred_a_second_for_an_upstream() -> None:
    """Each such line goes to every client that listens: an upstream's chatter outside any
    call cost the gateway one send per client per line. Past ``broadcast.RATE`` a second they
    are dropped (and counted), however many the upstream writes."""
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")]}
    heard: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))

    async with (
        running_gateway({"upstreams": {"noisy": noisy}}) as gw,
        Client(gw.url, mode="legacy", logging_callback=on_log) as client,
    ):
        with anyio.fail_after(BOUND):
            assert text_of(await client.call_tool("noisy__flood", {"lines": 3000, "size": 100})) == "flood"
            started = time.monotonic()
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                await client.set_logging_level("debug")  # passed on to the upstream: the flood
            assert text_of(await client.call_tool("noisy__echo", {"text": "read"})) == "read"  # after it
            lasted = time.monotonic() - started
            count = len(heard)
    assert 0 < count <= broadcast.RATE * (1 + lasted) + broadcast.QUEUED, (count, lasted)


async def test_an_upstreams_requests_past_256_being_answered_are_refused_at_once() -> None:
    """The SDK starts a task for each request an upstream sends (``ping`` among them, answered
    by the SDK itself): an upstream sending them flat out while not reading their answers held
    51,683 tasks. Past ``MAX_ASKED`` being answered, one is answered with an error unread."""
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")], "notification_rate": 100_000}
    # Read 200 a second, their answers (a kilobyte each) fill its stdin pipe and the event
    # loop's write buffer (64 KiB each) after some 130, then wait in the gateway: past 390
    # taken, the bound is reached wherever the gateway takes over 300 a second.
    pings = 1200
    most = [0]

    async def sample(stop: anyio.Event) -> None:
        while not stop.is_set():
            most[0] = max(most[0], len(asyncio.all_tasks()))
            await anyio.sleep(0.005)

    async with (
        running_gateway({"upstreams": {"noisy": noisy}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        before, stop = len(asyncio.all_tasks()), anyio.Event()
        answered: dict[str, int] = {}
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample, stop)
                assert text_of(await client.call_tool("noisy__pings", {"times": pings})) == "pings"
                while sum(answered.values()) < pings:  # each answered, one way or the other
                    # Asked while its stdin is full of answers, the call may time out (on a
                    # loaded 2-core machine): asked again, the state is what is waited on.
                    reply = await client.call_tool("noisy__answered", {})
                    if not reply.is_error:
                        answered = json.loads(text_of(reply))
                stop.set()
    assert answered["error"] > 0, answered  # refused at once, unread
    assert answered["result"] >= MAX_ASKED, answered
    assert most[0] - before < MAX_ASKED + 100, (most[0], before)


async def test_a_session_over_its_rate_is_said_so_once_in_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once a line held, each line made (then left out by the log's filter of repeats) cost a
    sixth of the gateway's CPU while it read an upstream at its pace."""
    caplog.set_level(logging.WARNING, logger="agent_gateway.upstreams.pace")
    noisy = {"command": sys.executable, "args": [str(SERVERS / "noisy.py")], "notification_rate": RATE}
    async with (
        running_gateway({"upstreams": {"noisy": noisy}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        started = time.monotonic()
        with anyio.fail_after(BOUND):
            vendor = {"lines": LINES, "size": 40, "during": True, "method": "notifications/x-vendor/tick"}
            assert text_of(await client.call_tool("noisy__flood", vendor)) == "flood"
        lasted = time.monotonic() - started
    warned = [r for r in caplog.records if "read more slowly" in r.getMessage()]
    assert lasted >= (LINES - RATE - BUFFERED) / RATE  # it was held: read at its pace
    assert 1 <= len(warned) <= 1 + lasted // WARN_EVERY, (len(warned), lasted)
