"""A stdio upstream's own children: a process the server started that inherited its stdout
(a helper, a browser) goes with the server, whether it crashed or was stopped."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.support import python_upstream, running_gateway
from tests.test_upstreams import text_of


def with_a_helper(upstream: dict[str, Any], pid_file: Path, run: str = "") -> dict[str, Any]:
    """``upstream`` started by a shell that first starts a helper (``sleep``) holding the
    server's stdout and stderr, writes its pid to ``pid_file``, then becomes the server (exec:
    the server is the group's leader, the helper its sibling in the group; ``run``:
    ``setsid `` makes the helper a daemon, out of the group)."""
    server = shlex.join([upstream["command"], *upstream["args"]])
    script = f"{run}sleep 120 & echo $! > {shlex.quote(str(pid_file))}; exec {server}"
    return {**upstream, "command": "sh", "args": ["-c", script]}


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it waits only to be
    reaped, by init here since its parent is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def gone(pid: int) -> bool:
    with anyio.move_on_after(10):
        while running(pid):  # no event exists for another process's exit
            await anyio.sleep(0.05)
        return True
    return False


async def test_a_server_that_crashes_leaving_a_child_on_its_stdout_fails_the_call_at_once(
    tmp_path: Path,
) -> None:
    # The helper held the pipe open: the gateway read on, the call waited out its timeout
    # ("no answer within 10s") and the helper outlived every restart.
    helper = tmp_path / "helper.pid"
    counter = with_a_helper(python_upstream("counter.py", timeout=10, health={"interval": None}), helper)
    async with running_gateway({"upstreams": {"counter": counter}}) as gw, Client(gw.url) as client:
        server_pid = int(text_of(await client.call_tool("counter__pid", {})))
        helper_pid = int(helper.read_text())
        assert running(helper_pid)
        crashed = await client.call_tool("counter__crash", {})
        assert crashed.is_error
        assert "connection closed during the call" in text_of(crashed)
        assert await gone(helper_pid)
        assert not running(server_pid)


async def test_a_server_that_exits_at_the_end_of_its_input_takes_its_child_with_it(tmp_path: Path) -> None:
    # The server exits as its input ends, so the gateway never signalled its group: the
    # helper, holding the server's stdout, outlived the gateway (reparented to init).
    helper = tmp_path / "helper.pid"
    counter = with_a_helper(python_upstream("counter.py"), helper)
    async with running_gateway({"upstreams": {"counter": counter}}) as gw, Client(gw.url) as client:
        server_pid = int(text_of(await client.call_tool("counter__pid", {})))
        helper_pid = int(helper.read_text())
        assert running(helper_pid)
    assert not running(server_pid)
    assert await gone(helper_pid)


async def test_a_crash_whose_stdout_a_daemon_keeps_is_told_as_the_connection_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A daemon (its own session, so not stopped with the group) kept the server's stderr too:
    # closing it under the reader of its lines at the stop raised into the transport, and the
    # upstream was down for "ClosedResourceError: ClosedResourceError" (in /readyz and the log).
    # It is down for how its process ended.
    helper = tmp_path / "daemon.pid"
    counter = with_a_helper(python_upstream("counter.py", health={"interval": None}), helper, "setsid ")
    try:
        async with running_gateway({"upstreams": {"counter": counter}}) as gw, Client(gw.url) as client:
            crashed = await client.call_tool("counter__crash", {})
            assert "connection closed during the call" in text_of(crashed)
            with anyio.fail_after(10):
                while not (down := [r for r in caplog.records if " is down: " in r.getMessage()]):
                    await anyio.sleep(0.05)
    finally:
        os.kill(int(helper.read_text()), signal.SIGKILL)
    assert [r.getMessage() for r in down] == [
        "upstream counter is down: upstream 'counter': the process exited with code 3"
    ]
