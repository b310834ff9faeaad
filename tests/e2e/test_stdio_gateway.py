"""``agent-gateway serve --transport stdio`` as a client's subprocess, and its exit with the client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.e2e.peers import (
    BOUND,
    MODES,
    PROTOCOL_OF_MODE,
    command_of,
    descendants,
    exited,
    processes_with_arg,
    text_of,
)
from tests.support import ROOT, gateway_env, npm_server, outliving_its_input, python_upstream

pytestmark = pytest.mark.e2e

AGENT_GATEWAY = str(Path(sys.executable).parent / "agent-gateway")
DESKTOP_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The PATH a desktop app (Claude Desktop, Cursor) gives the commands it launches."""
_TRUST = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY")


def write_config(directory: Path) -> Path:
    """A gateway.yaml in ``directory`` with two stdio npm upstreams, one that outlives its input."""
    memory = {
        **outliving_its_input(npm_server("server-memory")),
        "env": {"MEMORY_FILE_PATH": str(directory / "memory.jsonl")},
    }
    config = {
        "server": {"transport": "stdio"},
        "upstreams": {"everything": npm_server("server-everything", "stdio"), "memory": memory},
    }
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def serve_args(config: Path) -> list[str]:
    return ["--log-level", "warning", "serve", "--transport", "stdio", "-c", str(config)]


async def all_exited(pids: set[int]) -> None:
    """Return once every process in ``pids`` has terminated; fail naming the survivors."""
    try:
        with anyio.fail_after(BOUND):
            for pid in pids:
                await exited(pid)
    except TimeoutError:
        survivors = {pid: command_of(pid) for pid in pids}
        for pid in pids:  # the test fails; nothing is left behind for the next one
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes outlived the gateway: {survivors}") from None


def gateway_over_stdio(config: Path) -> StdioServerParameters:
    """How a client launches the gateway on ``config`` as its stdio server."""
    return StdioServerParameters(command=AGENT_GATEWAY, args=serve_args(config), env=gateway_env())


def upstream_commands(pids: set[int]) -> list[str]:
    return [command_of(pid) for pid in pids]


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_calls_a_tool_through_the_gateway_launched_over_stdio(
    tmp_path: Path, mode: str
) -> None:
    params = gateway_over_stdio(write_config(tmp_path))
    with anyio.fail_after(BOUND):
        async with Client(params, mode=mode) as client:
            assert client.protocol_version == PROTOCOL_OF_MODE[mode]
            result = await client.call_tool("everything__get-sum", {"a": 2, "b": 3})
            entity = {"name": f"stdio-{mode}", "entityType": "test", "observations": []}
            created = await client.call_tool("memory__create_entities", {"entities": [entity]})
    assert text_of(result) == "The sum of 2 and 3 is 5."
    assert not created.is_error, text_of(created)


@pytest.mark.parametrize("mode", MODES)
async def test_the_gateway_and_its_upstreams_are_gone_after_the_client_closes(
    tmp_path: Path, mode: str
) -> None:
    config = write_config(tmp_path)
    params = gateway_over_stdio(config)
    with anyio.fail_after(BOUND):
        async with Client(params, mode=mode) as client:
            await client.call_tool("everything__echo", {"message": "still here"})
            [gateway] = processes_with_arg(str(config))
            children = descendants(gateway)
            commands = upstream_commands(children)
            assert any("server-everything" in c for c in commands), commands
            assert any("server-memory" in c for c in commands), commands
    await all_exited({gateway, *children})


async def test_the_gateway_exits_cleanly_on_end_of_input_and_reaps_its_upstreams(tmp_path: Path) -> None:
    stderr = (tmp_path / "gateway.stderr").open("wb")
    process = await anyio.open_process(
        [AGENT_GATEWAY, *serve_args(write_config(tmp_path))], env=gateway_env(), stderr=stderr
    )
    async with process:
        assert process.stdin is not None
        assert process.stdout is not None
        with anyio.fail_after(BOUND):
            await process.stdin.send(json.dumps(_initialize()).encode() + b"\n")
            reply = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 1_000_000)
        assert json.loads(reply)["result"]["protocolVersion"] == "2025-11-25"
        children = descendants(process.pid)
        assert len(children) >= 3, upstream_commands(children)  # two servers and a shell
        await process.stdin.aclose()
        with anyio.fail_after(BOUND):
            returncode = await process.wait()
    stderr.close()
    assert returncode == 0, (tmp_path / "gateway.stderr").read_text()
    await all_exited(children)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_the_gateway_while_its_client_keeps_stdin_open(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl-C in a terminal, or a supervisor that signals before closing the pipe: the
    gateway exits and reaps its upstreams without waiting for the client's next line."""
    process = await anyio.open_process(
        [AGENT_GATEWAY, *serve_args(write_config(tmp_path))], env=gateway_env()
    )
    async with process:
        assert process.stdin is not None
        assert process.stdout is not None
        with anyio.fail_after(BOUND):
            await process.stdin.send(json.dumps(_initialize()).encode() + b"\n")
            await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 1_000_000)
        children = descendants(process.pid)
        process.send_signal(signum)
        with anyio.fail_after(BOUND):  # stdin stays open all along
            returncode = await process.wait()
        assert returncode == 0
    await all_exited(children)


async def test_a_request_over_max_body_bytes_is_refused_by_its_id_and_the_next_one_served(
    tmp_path: Path,
) -> None:
    counter = {"command": sys.executable, "args": [str(ROOT / "tests" / "servers" / "counter.py")]}
    config = {"server": {"transport": "stdio", "max_body_bytes": 2048}, "upstreams": {"counter": counter}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    process = await anyio.open_process([AGENT_GATEWAY, *serve_args(path)], env=gateway_env())
    async with process:
        assert process.stdin is not None
        assert process.stdout is not None
        replies = BufferedByteReceiveStream(process.stdout)
        big = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "x" * 4096}}
        ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
        with anyio.fail_after(BOUND):
            await process.stdin.send(json.dumps(_initialize()).encode() + b"\n")
            await replies.receive_until(b"\n", 1_000_000)
            for message in (big, ping):
                await process.stdin.send(json.dumps(message).encode() + b"\n")
            refused = json.loads(await replies.receive_until(b"\n", 1_000_000))
            served = json.loads(await replies.receive_until(b"\n", 1_000_000))
        await process.stdin.aclose()
        with anyio.fail_after(BOUND):
            await process.wait()
    assert refused["id"] == 2
    assert refused["error"]["code"] == -32600
    assert "is over server.max_body_bytes (2048)" in refused["error"]["message"]
    assert served == {"jsonrpc": "2.0", "id": 3, "result": {}}


MALFORMED = [  # (a line, the id its error answers, the error's code)
    (b'{"jsonrpc":"2.0","id":11,"method":"ping"', None, -32700),  # cut short: not JSON
    (b'[{"jsonrpc":"2.0","id":12,"method":"ping"}]', 12, -32600),  # a batch of one request
    (b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":[1,2]}', 13, -32600),
    (b'{"jsonrpc":"1.0","id":14,"method":"ping"}', 14, -32600),
    (b'{"jsonrpc":"2.0","id":15.5,"method":"ping"}', None, -32600),  # an id it cannot answer to
    (
        b'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"rec__say","arguments":{"text":'
        + b"[" * 300
        + b"]" * 300
        + b"}}}",
        16,
        -32600,
    ),
    (
        b'{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"rec__say","arguments":{"text":"\xff"}}}',
        17,
        -32700,
    ),
]


async def test_malformed_lines_are_answered_with_an_error_each_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    config = {"server": {"transport": "stdio"}, "upstreams": {"rec": python_upstream("recorder.py")}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    stderr = tmp_path / "gateway.stderr"
    with stderr.open("wb") as errors:
        process = await anyio.open_process(
            [AGENT_GATEWAY, *serve_args(path)], env=gateway_env(), stderr=errors
        )
    async with process:
        assert process.stdin is not None
        assert process.stdout is not None
        replies = BufferedByteReceiveStream(process.stdout)

        async def send(*lines: bytes) -> None:
            for line in lines:
                await process.stdin.send(line + b"\n")  # pyright: ignore[reportOptionalMemberAccess]

        async def reply() -> dict[str, Any]:  # the next answer or request (notifications skipped)
            while "id" not in (message := json.loads(await replies.receive_until(b"\n", 1_000_000))):
                pass
            return message

        with anyio.fail_after(BOUND):
            await send(json.dumps(_initialize(capabilities={"sampling": {}})).encode())
            await reply()
            await send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
            await send(*(line for line, _, _ in MALFORMED))
            refused = [await reply() for _ in MALFORMED]
            # A malformed answer from the client: logged, not answered (it answers nothing of its own).
            await send(b'{"jsonrpc":"2.0","id":"nobody","result":"text"}')
            sampled = await _sampled(send, reply)
            await send(_call(21, "rec__say", {"text": "still here"}))
            served = await reply()
        await process.stdin.aclose()
        with anyio.fail_after(BOUND):
            await process.wait()
    assert [(r["id"], r["error"]["code"]) for r in refused] == [(i, code) for _, i, code in MALFORMED]
    messages = [r["error"]["message"] for r in refused]
    assert messages[1].startswith("a batch (JSON array): MCP does not use batches")
    assert messages[2:5] == [
        "params must be an object, not an array",
        '"jsonrpc" must be "2.0", not "1.0"',
        "a request id must be a string or an integer, not 15.5",
    ]
    assert messages[5] == "the request is nested too deeply to read"
    assert messages[6] == "the line is not valid UTF-8, as JSON-RPC's text must be"  # not read with U+FFFD
    assert sampled["result"]["content"][0]["text"] == "model says: hi"
    assert served["id"] == 21
    assert served["result"]["content"][0]["text"] == "still here"
    warnings = [line for line in stderr.read_text().splitlines() if "stdio: a line of" in line]
    assert len(warnings) == len(MALFORMED) + 1, warnings
    assert 'an answer to id "nobody" is malformed' in warnings[-1]
    assert "Traceback" not in stderr.read_text()


async def _sampled(
    send: Callable[..., Awaitable[None]], reply: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """A tool call whose upstream asks the client's model: the client's answer, a line it
    writes to the gateway, is taken (not refused), and the call's answer comes back."""
    await send(_call(20, "rec__sample", {"prompt": "hi"}))
    request = await reply()
    assert request["method"] == "sampling/createMessage"
    content = {"type": "text", "text": "model says: hi"}
    answer = {"role": "assistant", "content": content, "model": "test-model"}
    await send(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": answer}).encode())
    return await reply()


def _call(request_id: int, name: str, arguments: dict[str, object]) -> bytes:
    params = {"name": name, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


def _initialize(capabilities: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities or {},
            "clientInfo": {"name": "e2e", "version": "0"},
        },
    }


async def test_launched_like_a_desktop_app_the_shipped_config_serves_every_upstream(tmp_path: Path) -> None:
    """A minimal PATH without the venv, and a working directory that is not the config's."""
    home, elsewhere = tmp_path / "config", tmp_path / "app"
    home.mkdir()
    elsewhere.mkdir()
    shutil.copy(ROOT / "gateway.yaml", home / "gateway.yaml")
    # The machine's trust settings (a TLS-inspecting proxy here) too, for npx's first download.
    env = {"PATH": DESKTOP_PATH, **{k: os.environ[k] for k in _TRUST if k in os.environ}}
    params = StdioServerParameters(
        command=AGENT_GATEWAY, args=serve_args(home / "gateway.yaml"), env=env, cwd=elsewhere
    )
    entity = {"name": "desktop", "entityType": "test", "observations": ["launched by an app"]}
    with anyio.fail_after(BOUND * 2):
        async with Client(params, mode="legacy") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            created = await client.call_tool("memory__create_entities", {"entities": [entity]})
            added = await client.call_tool("notes__add", {"text": "from the desktop"})
    assert {"everything__echo", "memory__read_graph", "notes__add", "notes__list_notes"} <= names
    assert not created.is_error, text_of(created)
    assert not added.is_error, text_of(added)
    assert "launched by an app" in (home / ".agent-gateway" / "memory.jsonl").read_text(encoding="utf-8")
    assert not (elsewhere / ".agent-gateway").exists()
