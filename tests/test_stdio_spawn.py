"""A stdio upstream's process as `serve` spawns it (on uvloop), and how its end is told: a
server that closes its stdout is down at once, and one that exits or is killed is down for
how it ended, saying nothing of its command line or environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from agent_gateway.runtime import has_uvloop
from tests.support import gateway_child, python_upstream, running_gateway
from tests.test_upstreams import text_of

SECRET = "s3cret-in-args-and-env"


def ending_server() -> dict[str, Any]:
    """The raw stdio server whose calls can end it, one way or another; a secret in its
    arguments and environment; its calls' timeout 10 s and no health check, so only its
    transport can see it go within that."""
    upstream = python_upstream("raw_stdio.py", env={"RAW_ENDINGS": "1", "ENDING_TOKEN": SECRET})
    upstream["args"].append(f"--token={SECRET}")
    return upstream | {"protocol": "legacy", "timeout": 10, "health": {"interval": None}}


async def test_a_server_that_closes_its_stdout_is_down_at_once_on_uvloop(tmp_path: Path) -> None:
    # Under uvloop each child held copies of its own stdin, stdout and stderr besides 0, 1 and
    # 2 (uvloop left the ends it spawned with inheritable): closing its stdout closed nothing,
    # and the call waited out its timeout ("no answer within 10s").
    assert has_uvloop()
    config = {"upstreams": {"good": python_upstream("counter.py"), "bad": ending_server()}}
    async with gateway_child(config, tmp_path) as (base, gateway), Client(f"{base}/mcp") as client:
        maps = await anyio.Path(f"/proc/{gateway.pid}/maps").read_text()
        assert "/uvloop/loop." in maps  # the loop serve runs
        assert json.loads(text_of(await client.call_tool("bad__held", {}))) == []
        hung_up = await client.call_tool("bad__hang_up", {})
        assert hung_up.is_error
        assert "connection closed during the call (the process closed its stdout)" in text_of(hung_up)
        bystander = await client.call_tool("good__increment", {})
        assert not bystander.is_error


@pytest.mark.parametrize(
    ("tool", "how"),
    [("exit", "the process exited with code 3"), ("sigkill", "the process was killed by SIGKILL")],
    ids=["exit", "sigkill"],
)
async def test_a_server_that_ends_is_down_for_how_it_ended(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tool: str, how: str
) -> None:
    # Its calls failed "connection closed during the call (connection closed)", and the log
    # said only "connection closed": not whether it crashed, exited or was killed.
    async with (
        running_gateway({"upstreams": {"bad": ending_server()}}) as gw,
        Client(gw.url) as client,
    ):
        ended = await client.call_tool(f"bad__{tool}", {})
        with anyio.fail_after(10):
            while not (down := [r.getMessage() for r in caplog.records if " is down: " in r.getMessage()]):
                await anyio.sleep(0.05)
        [status] = gw.gateway.pool.statuses()
    assert ended.is_error
    assert text_of(ended) == f"upstream 'bad': tool '{tool}': connection closed during the call ({how})"
    assert status.last_error == f"upstream 'bad': {how}"
    assert down == [f"upstream bad is down: upstream 'bad': {how}"]
    assert SECRET not in text_of(ended) + caplog.text + str(status.last_error)
