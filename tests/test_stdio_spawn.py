"""A stdio upstream's process as `serve` spawns it (on uvloop), and how its end is told: a
server that closes its stdout is down at once, and one that exits or is killed is down for
how it ended, saying nothing of its command line or environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from agent_gateway.runtime import has_uvloop
from tests.support import gateway_child, python_upstream, running_gateway
from tests.test_upstreams import text_of

SERVER = r'''
import json, os, signal, stat, sys, time

def held():
    """What the process holds besides its stdin, stdout and stderr: sockets and pipes."""
    found = []
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # the directory listdir read, closed since
            continue
        if fd > 2 and (stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)):
            found.append(fd)
    return found

for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue
    method, result = request["method"], {}
    if method == "initialize":
        result = {"protocolVersion": request["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "ending", "version": "1"}}
    elif method == "tools/list":
        names = ("held", "hang_up", "exit", "sigkill")
        result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in names]}
    elif method == "tools/call":
        name = request["params"]["name"]
        if name == "hang_up":  # done, as far as the gateway goes: it runs on
            sys.stdout.flush()
            os.close(1)
            time.sleep(120)
        if name == "exit":
            os._exit(3)
        if name == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        result = {"content": [{"type": "text", "text": json.dumps(held())}]}
    elif method != "ping":
        error = {"code": -32601, "message": "no such method"}
        print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}), flush=True)
'''

SECRET = "s3cret-in-args-and-env"


def ending_server(tmp_path: Path) -> dict[str, Any]:
    """A raw stdio server (the script above) whose calls can end it, one way or another; a
    secret in its arguments and environment; its calls' timeout 10 s and no health check, so
    only its transport can see it go within that."""
    script = tmp_path / "ending.py"
    script.write_text(SERVER)
    return {
        "command": sys.executable,
        "args": [str(script), f"--token={SECRET}"],
        "env": {"ENDING_TOKEN": SECRET},
        "protocol": "legacy",
        "timeout": 10,
        "health": {"interval": None},
    }


async def test_a_server_that_closes_its_stdout_is_down_at_once_on_uvloop(tmp_path: Path) -> None:
    # Under uvloop each child held copies of its own stdin, stdout and stderr besides 0, 1 and
    # 2 (uvloop left the ends it spawned with inheritable): closing its stdout closed nothing,
    # and the call waited out its timeout ("no answer within 10s").
    assert has_uvloop()
    config = {"upstreams": {"good": python_upstream("counter.py"), "bad": ending_server(tmp_path)}}
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
        running_gateway({"upstreams": {"bad": ending_server(tmp_path)}}) as gw,
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
