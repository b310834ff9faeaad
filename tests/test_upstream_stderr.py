"""A stdio upstream's stderr: passed on as the gateway's own log lines, cut, without the
upstream's credentials, within a rate; never written past the gateway's log."""

from __future__ import annotations

import json
from pathlib import Path

from mcp import Client

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
