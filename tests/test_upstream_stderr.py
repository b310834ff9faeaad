"""A stdio upstream's stderr: passed on as the gateway's own log lines, cut, without the
upstream's credentials, within a rate; never written past the gateway's log."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client

from agent_gateway.upstreams.stderr import StderrLines
from tests.faults.harness import text_of
from tests.support import gateway_child, python_upstream

TOKEN = "chatty-secret-credential-0123456789"


async def test_a_stdio_upstreams_stderr_is_logged_by_the_gateway_cut_scrubbed_and_bounded(
    tmp_path: Path,
) -> None:
    # The child wrote to the gateway's stderr itself: not JSON, not clipped, not bounded, and
    # an upstream that printed its environment put its credential in the gateway's log.
    log = tmp_path / "gateway.log"
    upstream = python_upstream("raw_stdio.py", env={"RAW_TOKEN": TOKEN})
    config = {"upstreams": {"chatty": upstream}, "telemetry": {"log_format": "json"}}
    async with gateway_child(config, tmp_path, log) as (base, _), Client(f"{base}/mcp") as client:
        assert text_of(await client.call_tool("chatty__hello", {})) == "hello"
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]  # every one JSON
    passed = [line["message"] for line in lines if " stderr: " in line["message"]]
    assert TOKEN not in log.read_text()
    assert passed[0].startswith("upstream chatty/")  # its session's label
    assert passed[0].endswith(" stderr: starting with token [redacted]")
    assert len(passed) < 5000
    assert any("lines before it left out: over 100 a second" in line for line in passed)
    assert all(len(line) < 5000 for line in passed)
    assert passed[1].endswith("… (100,000 characters, cut)")


async def test_the_count_of_lines_left_out_is_logged_when_the_reading_is_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The transport's stop cancels the reading: a burst read within a second of it lost its
    # count (the line saying so waits for a quiet second), and once the gateway's log.
    caplog.set_level(logging.INFO, logger="agent_gateway.upstreams.stderr")
    pipe_in, pipe_out = anyio.create_memory_object_stream[bytes](0)  # each send: taken
    burst = b"".join(f"line {n}\n".encode() for n in range(5000))
    async with pipe_in, pipe_out, anyio.create_task_group() as tg:
        tg.start_soon(StderrLines("chatty/1", ()).pass_on, BufferedByteReceiveStream(pipe_out))
        for start in range(0, len(burst), 4096):
            await pipe_in.send(burst[start : start + 4096])
        await pipe_in.send(b"")  # taken once the burst before it is read whole
        tg.cancel_scope.cancel()
    assert_counted(caplog, 5000)


async def test_the_count_of_lines_left_out_is_logged_once_the_stream_is_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A burst read whole has no next line to carry its count: it is written on a line of its
    # own once stderr has been quiet for a second, the process still running.
    caplog.set_level(logging.INFO, logger="agent_gateway.upstreams.stderr")
    pipe_in, pipe_out = anyio.create_memory_object_stream[bytes](0)
    async with pipe_in, pipe_out, anyio.create_task_group() as tg:
        tg.start_soon(StderrLines("chatty/1", ()).pass_on, BufferedByteReceiveStream(pipe_out))
        burst = b"".join(f"line {n}\n".encode() for n in range(5000))
        for start in range(0, len(burst), 4096):
            await pipe_in.send(burst[start : start + 4096])
        with anyio.fail_after(10):  # a count on a line of its own (the burst's last line let
            # through as the bucket refilled, 1 run in hundreds, leaves none to count)
            while (
                not caplog.records[-1].getMessage().startswith((COUNT, "upstream chatty/1 stderr: line 4999"))
            ):
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert_counted(caplog, 5000)


COUNT = "upstream chatty/1 stderr: ("


def assert_counted(caplog: pytest.LogCaptureFixture, lines: int) -> None:
    """Every one of ``lines`` passed on or counted (a line the bucket let through as it
    refilled carries the count of those before it; the last ones' count is a line of its own)."""
    messages = [record.getMessage() for record in caplog.records]
    passed = [m for m in messages if m.startswith("upstream chatty/1 stderr: line ")]
    left_out = sum(int(n) for n in re.findall(r"\((\d+) lines before it left out", "\n".join(messages)))
    assert 100 <= len(passed) < lines
    assert len(passed) + left_out == lines
