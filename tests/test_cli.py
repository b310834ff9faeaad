"""The command line: check, tools, serve (with a clean shutdown that reaps children)."""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import httpx
import mcp_types as types
import pytest
import yaml
from anyio.abc import TaskStatus
from fastmcp import FastMCP
from mcp import Client

import agent_gateway
from agent_gateway import runtime
from agent_gateway.cli import main, parse_arguments
from agent_gateway.errors import CommandNotFound
from agent_gateway.upstreams.environment import check_command
from tests.e2e.peers import command_of, descendants, exited
from tests.support import (
    LOOPBACK_HEX,
    SERVERS,
    child_process,
    free_port,
    free_socket,
    gateway_env,
    listening_addresses,
    outliving_its_input,
    python_upstream,
    ready,
    running_gateway,
    serving_upstream,
)

LEGACY = "2025-11-25"


def write_config(tmp_path: Path, upstreams: dict[str, object], **server: object) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"server": server, "upstreams": upstreams}))
    return path


def counter() -> dict[str, object]:
    return {"command": sys.executable, "args": [str(SERVERS / "counter.py")]}


def test_check_prints_a_summary_and_exits_zero_for_a_valid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, {"counter": counter(), "remote": {"url": "http://127.0.0.1:1/mcp"}})
    assert main(["check", "--offline", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: valid" in out
    assert "upstream counter: stdio" in out
    assert "upstream remote: streamable-http http://127.0.0.1:1/mcp" in out


def test_check_prints_file_field_and_reason_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, {"bad name": counter()})
    assert main(["check", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: upstreams.bad name: upstream name 'bad name'" in err


def test_tools_json_prints_the_catalog_and_upstream_states(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, {"counter": counter()})
    assert main(["--log-level", "warning", "tools", "-c", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = {tool["name"]: tool for tool in report["tools"]}
    assert names["counter__increment"]["upstream"] == "counter"
    assert names["counter__increment"]["description"].startswith("Add ``by``")
    [upstream] = report["upstreams"]
    assert upstream | {"last_up_at": None} == {
        "name": "counter",
        "transport": "stdio",
        "state": "up",
        "circuit": "closed",
        "last_error": None,
        "down_for_seconds": None,
        "last_up_at": None,
        "connections": 1,
        "in_flight": 0,
        "listing_refused": None,
        "window": None,
        "sent": 0,
        "waiting": 0,
    }
    assert upstream["last_up_at"]


def test_tools_reports_a_failed_upstream_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(
        tmp_path, {"counter": counter(), "broken": {"command": "/nonexistent/server", "connect_timeout": 5}}
    )
    assert main(["--log-level", "error", "tools", "-c", str(path)]) == 1
    out = capsys.readouterr().out
    assert "counter__increment" in out
    assert "broken" in out
    assert "down" in out
    assert "last error:" in out


async def test_a_module_is_imported_in_a_worker_thread_while_the_body_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How serve imports the agent's libraries while the upstreams connect (Gateway.running).
    (tmp_path / "imported_aside.py").write_text(
        "import threading\nON_MAIN_THREAD = threading.current_thread() is threading.main_thread()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    async with runtime.importing("imported_aside") as imported:
        await imported.wait()
    assert sys.modules["imported_aside"].ON_MAIN_THREAD is False
    with pytest.raises(ExceptionGroup) as raised:
        async with runtime.importing("imported_aside_nowhere"):
            pass
    assert raised.group_contains(ModuleNotFoundError)


async def test_serve_over_http_answers_clients_and_reaps_children_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    # A shell that outlives the server's end of input: only the gateway's stop can end it.
    path = write_config(tmp_path, {"counter": outliving_its_input(counter())}, port=port)
    gateway = subprocess.Popen(
        [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(path)], env=gateway_env()
    )
    try:
        await ready(port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            status = (await http.get("/status")).json()
        # No server.host in the file: the gateway's own socket is on loopback only.
        assert listening_addresses(port) == {LOOPBACK_HEX}
        # serve's process settings (runtime.py): uvloop, and the start-up heap frozen.
        assert status["runtime"]["event_loop"] == ("uvloop" if runtime.has_uvloop() else "asyncio")
        assert status["runtime"]["gc_frozen_objects"] > 10_000
        assert status["runtime"]["gc_thresholds"][0] == runtime.GEN0_THRESHOLD
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            result = await client.call_tool("counter__pid", {})
        block = result.content[0]
        assert isinstance(block, types.TextContent)
        child = int(block.text)
        stat = await anyio.Path(f"/proc/{child}/stat").read_text()
        shell = int(stat.rsplit(")", 1)[1].split()[1])  # its parent
        assert shell != gateway.pid
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(timeout=20) == 0
        for pid in (child, shell):
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait(timeout=10)


@contextlib.contextmanager
def serve_process(
    path: Path, *, stdin: int | None = None, stderr: IO[bytes] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``agent-gateway serve -c path`` in a child process; killed and reaped if it is still
    running at the end (the test failed), its input closed."""
    command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(path)]
    gateway = subprocess.Popen(command, env=gateway_env(), stdin=stdin, stderr=stderr)
    try:
        yield gateway
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait(timeout=10)
        if gateway.stdin is not None:
            gateway.stdin.close()


async def test_sigterm_ends_notification_streams_at_once_and_lets_a_streamed_call_finish(
    tmp_path: Path,
) -> None:
    """Draining: a client's notification stream (a handshake-era GET stream, a modern
    subscriptions/listen) ends at once, gracefully, so the client reconnects elsewhere; it
    does not hold the stop until ``drain_timeout`` (here an hour). A call in flight whose
    answer is already a stream (it sent progress) still gets its result, a second SIGTERM
    meanwhile notwithstanding."""
    port = free_port()
    upstreams: dict[str, object] = {"rec": python_upstream("recorder.py")}
    path = write_config(tmp_path, upstreams, port=port, drain_timeout=3600)
    url = f"http://127.0.0.1:{port}/mcp"
    ended: list[str] = []
    with serve_process(path) as gateway:
        await ready(port)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                get_stream_over = anyio.Event()
                await tg.start(held_get_stream, url, ended, get_stream_over)
                await tg.start(held_listen, url, ended)
                await tg.start(streamed_call, url, ended)
                gateway.send_signal(signal.SIGTERM)
                await get_stream_over.wait()  # the first is being handled: the drain is on
                gateway.send_signal(signal.SIGTERM)  # only logged: the call in flight still finishes
        assert sorted(ended) == ["call answered: done", "get stream", "listen"]
        assert await anyio.to_thread.run_sync(gateway.wait, 20) == 0


def slow_to_start(seconds: int = 30) -> dict[str, object]:
    """An upstream that takes ``seconds`` to start (a first-time ``npx`` download, say)."""
    server = " ".join([sys.executable, str(SERVERS / "counter.py")])
    return {"command": "sh", "args": ["-c", f"sleep {seconds}; exec {server}"], "connect_timeout": 60}


async def started_children(pid: int) -> set[int]:
    """The processes ``pid`` has started, once the slow upstream's ``sleep`` is among them."""
    with anyio.fail_after(20):
        while True:
            found = descendants(pid)
            if any(command_of(child).startswith("sleep") for child in found):
                return found
            await anyio.sleep(0.05)


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_sigterm_during_start_up_stops_it_and_reaps_what_it_started(
    tmp_path: Path, transport: str
) -> None:
    upstreams: dict[str, object] = {"slow": slow_to_start(), "counter": counter()}
    path = write_config(tmp_path, upstreams, transport=transport, port=free_port())
    # Over stdio, a client that keeps its end open.
    with serve_process(path, stdin=subprocess.PIPE) as gateway:
        children = await started_children(gateway.pid)
        gateway.send_signal(signal.SIGTERM)
        # Before: SIGTERM's default action, the shell and its sleep left running.
        assert await anyio.to_thread.run_sync(gateway.wait, 20) == 0
        with anyio.fail_after(10):
            for pid in children:
                await exited(pid)


async def test_while_upstreams_start_probes_are_answered_and_mcp_is_told_to_retry(tmp_path: Path) -> None:
    port = free_port()
    path = write_config(tmp_path, {"slow": slow_to_start(30), "counter": counter()}, port=port)
    with serve_process(path) as gateway:
        await started_children(gateway.pid)  # the slow upstream is still starting: 30 s
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            with anyio.fail_after(20):
                while True:  # bound, maybe not yet listening: the process is importing
                    with contextlib.suppress(httpx.TransportError):
                        alive = await http.get("/healthz")
                        break
                    await anyio.sleep(0.05)
            readiness = await http.get("/readyz")
            call = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        # Before: connection refused until every upstream had settled (probes failed).
        assert alive.status_code == 200
        assert readiness.status_code == 503
        states = {u["name"]: u["state"] for u in readiness.json()["upstreams"]}
        assert readiness.json()["starting"] is True
        assert set(states) == {"slow", "counter"}
        assert states["slow"] == "connecting"
        assert call.status_code == 503
        assert call.headers["retry-after"] == "1"
        gateway.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(gateway.wait, 20) == 0


async def test_sighup_during_start_up_is_a_reload_once_started(tmp_path: Path) -> None:
    port = free_port()
    # Still starting for 2 s once its ``sleep`` is seen: the SIGHUP sent then lands in it.
    path = write_config(tmp_path, {"slow": slow_to_start(2), "counter": counter()}, port=port)
    log = tmp_path / "gateway.log"
    with log.open("wb") as out, serve_process(path, stderr=out) as gateway:
        await started_children(gateway.pid)
        gateway.send_signal(signal.SIGHUP)  # before: its default action ended the process
        await ready(port)
        with anyio.fail_after(20):
            while "reloaded" not in log.read_text():
                await anyio.sleep(0.05)
        assert gateway.poll() is None
        gateway.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(gateway.wait, 20) == 0


async def held_get_stream(
    url: str, ended: list[str], over: anyio.Event, *, task_status: TaskStatus[None]
) -> None:
    """A handshake-era session's notification stream, read until the gateway ends it."""
    async with httpx.AsyncClient(timeout=None) as http:
        session = await handshake(http, url)
        headers = {"accept": "text/event-stream", "mcp-session-id": session, "mcp-protocol-version": LEGACY}
        async with http.stream("GET", url, headers=headers) as stream:
            assert stream.status_code == 200
            task_status.started()
            async for _ in stream.aiter_bytes():  # raises if the stream is cut, not ended
                pass
    ended.append("get stream")
    over.set()


async def held_listen(url: str, ended: list[str], *, task_status: TaskStatus[None]) -> None:
    """A modern client's listen stream, read until the gateway closes it (an abrupt end
    raises ``SubscriptionLost``)."""
    async with Client(url) as client, client.listen(tools_list_changed=True) as subscription:
        task_status.started()
        async for _ in subscription:
            pass
        ended.append("listen")


async def streamed_call(url: str, ended: list[str], *, task_status: TaskStatus[None]) -> None:
    """A handshake-era call that reports progress (its answer becomes a stream), then waits."""
    async with httpx.AsyncClient(timeout=None) as http:
        session = await handshake(http, url)
        headers = {
            "accept": "application/json, text/event-stream",
            "mcp-session-id": session,
            "mcp-protocol-version": LEGACY,
        }
        params = {"name": "rec__wait", "arguments": {"seconds": 2}, "_meta": {"progressToken": "p"}}
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        async with http.stream("POST", url, json=call, headers=headers) as stream:
            async for line in stream.aiter_lines():
                message = json.loads(line[5:]) if line.startswith("data:") else {}
                if message.get("method") == "notifications/progress":
                    task_status.started()
                elif "result" in message:
                    ended.append(f"call answered: {message['result']['content'][0]['text']}")


async def handshake(http: httpx.AsyncClient, url: str) -> str:
    """A handshake-era session opened over bare HTTP; its id."""
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": LEGACY}
    hello = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    answer = await http.post(
        url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}, headers=headers
    )
    session = answer.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await http.post(url, json=initialized, headers=headers | {"mcp-session-id": session})
    return session


def test_serve_on_a_public_address_from_the_command_line_meets_the_auth_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, {"counter": counter()})
    assert main(["serve", "-c", str(path), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "(with the command line's options): auth.mode: server.host '0.0.0.0' is not loopback" in err


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize(("flag", "expected"), [("info", logging.WARNING), ("debug", logging.DEBUG)])
def test_http_client_libraries_log_each_request_only_at_debug(
    tmp_path: Path, flag: str, expected: int, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # --log-level is taken after the command too (scripts/serve passes its arguments on to
    # serve): "serve --log-level debug" was refused as unrecognized.
    path = write_config(tmp_path, {"counter": counter()})
    chatty = [logging.getLogger(name) for name in runtime.CHATTY_LOGGERS]
    before = [logger.level for logger in chatty]
    command = ["check", "--offline", "-c", str(path)]
    argv = ["--log-level", flag, *command] if where == "before" else [*command, "--log-level", flag]
    try:
        assert main(argv) == 0
        assert [logger.level for logger in chatty] == [expected] * len(chatty)
    finally:
        for logger, level in zip(chatty, before, strict=True):
            logger.setLevel(level)


def test_log_level_after_the_command_wins_over_one_before_and_has_the_same_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_arguments(["--log-level", "error", "serve", "--log-level", "debug"]).log_level == "debug"
    assert parse_arguments(["pins", "list", "--log-level", "warning"]).log_level == "warning"
    assert parse_arguments(["serve"]).log_level == "info"
    with pytest.raises(SystemExit):
        parse_arguments(["serve", "--log-level", "loud"])
    assert "argument --log-level: invalid choice: 'loud'" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "logged"), [("info", False), ("debug", True)])
async def test_an_http_upstreams_requests_are_in_the_log_only_at_debug(
    tmp_path: Path, flag: str, logged: bool
) -> None:
    upstream = FastMCP("up")

    @upstream.tool
    def echo(text: str) -> str:
        return text

    port = free_port()
    log = tmp_path / "gateway.log"
    async with serving_upstream(upstream) as url:
        path = write_config(tmp_path, {"up": {"url": url}}, port=port)
        command = [
            str(Path(sys.executable).parent / "agent-gateway"),
            "--log-level",
            flag,
            "serve",
            "-c",
            str(path),
        ]
        async with child_process(command, gateway_env(), log):
            await ready(port)
            for mode in ("legacy", "auto"):  # a handshake-era upstream session, and the modern era's calls
                async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode) as client:
                    assert (await client.call_tool("up__echo", {"text": "x"})).is_error is False
    # httpx2's INFO line for each request the gateway sends its upstream: only when asked for.
    assert ("httpx2: HTTP Request: POST " + url in log.read_text()) is logged


def test_a_taken_port_is_one_line_and_exit_2_before_any_upstream_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = tmp_path / "started"
    witness = {"command": sys.executable, "args": ["-c", f"open({str(started)!r}, 'w')"]}
    with free_socket() as taken:
        taken.listen()
        port = taken.getsockname()[1]
        path = write_config(tmp_path, {"witness": witness}, port=port)
        collector = (gc.get_threshold(), gc.get_freeze_count())
        assert main(["serve", "-c", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot listen on 127.0.0.1:{port}: address already in use; pick another port with"
        " --port (or AGENT_GATEWAY_PORT, which the example gateway.yaml reads)\n"
    )
    assert not started.exists()
    assert (gc.get_threshold(), gc.get_freeze_count()) == collector  # the process left as it was


@pytest.mark.parametrize(
    "command", [["serve", "--transport", "stdio"], ["ask", "hello"]], ids=["stdio", "ask"]
)
async def test_telemetry_says_metrics_are_off_where_no_metrics_endpoint_is_served(
    tmp_path: Path, command: list[str]
) -> None:
    # Over stdio and in ask there is no /metrics: the line said "metrics on /metrics".
    path = write_config(tmp_path, {"counter": counter()})
    args = [str(Path(sys.executable).parent / "agent-gateway"), command[0], "-c", str(path), *command[1:]]
    env = {k: v for k, v in gateway_env().items() if not k.startswith("OTEL_")}
    with anyio.fail_after(60):
        done = await anyio.run_process(args, env=env, stdin=subprocess.DEVNULL, check=False)
    said = (
        "telemetry: traces off, metrics off (/metrics is served over HTTP only, and no OTLP endpoint is set)"
    )
    assert f"INFO agent_gateway.exporters: {said}\n" in done.stderr.decode()


async def test_telemetry_says_metrics_are_on_metrics_where_it_is_served(tmp_path: Path) -> None:
    port = free_port()
    path = write_config(tmp_path, {"counter": counter()}, port=port)
    log = tmp_path / "gateway.log"
    command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(path)]
    env = {k: v for k, v in gateway_env().items() if not k.startswith("OTEL_")}
    async with child_process(command, env, log), httpx.AsyncClient() as http:
        await ready(port)
        assert (await http.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200
    assert "INFO agent_gateway.exporters: telemetry: traces off, metrics on /metrics\n" in log.read_text()


def test_check_starts_the_upstreams_and_reports_a_name_collision_as_serve_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, {"a": {**counter(), "prefix": False}, "b": {**counter(), "prefix": False}})
    assert main(["--log-level", "error", "check", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tool name 'increment' is produced by both upstream 'a'" in err


@pytest.mark.parametrize("startup_wait", [None, 0.001])
def test_check_reports_each_upstream_up_with_its_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], startup_wait: float | None
) -> None:
    # check waits for every upstream, whatever server.startup_wait lets serve do: the counter's
    # process takes far longer than a millisecond to start.
    path = write_config(tmp_path, {"counter": counter()}, startup_wait=startup_wait)
    assert main(["--log-level", "error", "check", "-c", str(path)]) == 0
    assert "upstream counter: up, 4 tools" in capsys.readouterr().out


@pytest.mark.parametrize("offline", [False, True])
def test_check_names_a_missing_command_and_the_path_searched_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], offline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}/bin:/nowhere")
    path = write_config(tmp_path, {"counter": counter(), "ghost": {"command": "no-such-mcp-server"}})
    flags = ["--offline"] if offline else []
    assert main(["--log-level", "error", "check", *flags, "-c", str(path)]) == 1
    err = capsys.readouterr().err
    said = f"command 'no-such-mcp-server' not found on PATH '{tmp_path}/bin:/nowhere'"
    assert f"error: upstream ghost: {said}\n" in err


def test_a_long_path_searched_is_cut_in_the_message() -> None:
    searched = ":".join(f"/opt/tool-{n}/bin" for n in range(100))
    with pytest.raises(CommandNotFound) as missing:
        check_command("no-such-mcp-server", {"PATH": searched})
    said = str(missing.value)
    assert said.startswith(f"command 'no-such-mcp-server' not found on PATH '{searched[:40]}")
    assert said.endswith("…'")
    assert len(said) < 400


def test_a_missing_command_is_named_in_the_upstreams_state_and_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, {"ghost": {"command": "no-such-mcp-server"}})
    assert main(["tools", "-c", str(path)]) == 1
    assert "last error: command 'no-such-mcp-server' not found on PATH" in capsys.readouterr().out
    assert "upstream ghost is down: command 'no-such-mcp-server' not found on PATH" in caplog.text


def test_version_is_the_gateways_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"agent-gateway {agent_gateway.__version__}\n"
    assert agent_gateway.__version__ == importlib.metadata.version("agent-gateway")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_clients_are_told_the_gateways_name_and_version_not_fastmcps(mode: str) -> None:
    async with running_gateway({"upstreams": {}}) as gw, Client(gw.url, mode=mode) as client:
        info = client.server_info
    assert info is not None
    assert (info.name, info.version) == ("agent-gateway", agent_gateway.__version__)
