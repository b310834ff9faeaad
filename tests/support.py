"""Real servers for tests: ASGI apps on loopback, inline FastMCP upstreams, a running gateway."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import httpx
import uvicorn
import yaml
from anyio.streams.buffered import BufferedByteReceiveStream
from fastmcp import FastMCP
from langchain_core.language_models import BaseChatModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.config import GatewayConfig
from agent_gateway.config_files import parse_config
from agent_gateway.http import build_app
from agent_gateway.server import Gateway
from agent_gateway.serving import listener_options

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "tests" / "e2e" / "node_modules"
SERVERS = ROOT / "tests" / "servers"
STARTUP_BOUND = 20.0


def free_socket() -> socket.socket:
    """A listening-ready socket bound to an ephemeral loopback port."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only when the protocol says TCP, and
    # without it every split response waits out a 40 ms delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


_OWN_PORTS = 12_000
"""Ports below the kernel's ephemeral range that ``free_port`` hands out, split between the
test workers."""


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _worker_ports() -> Iterator[int]:
    """This test worker's ports, from a random place in its own slice, round and round."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), worker + 1)
    size = _OWN_PORTS // workers
    # Never below 1024: where the ephemeral range starts low the slice overlaps it instead
    # (the bind check still skips a port taken).
    first = max(_ephemeral_floor() - _OWN_PORTS, 1024) + worker * size
    start = random.randrange(size)  # another run on the same machine starts elsewhere
    while True:
        for offset in range(size):
            yield first + (start + offset) % size


_PORTS = _worker_ports()


def free_port() -> int:
    """A loopback port no one listens on, for a server in another process (or one started
    later). Not an ephemeral port freed for it: between its close and the child's bind, one
    was taken by another worker's server (``bind(0)``, a client's ``connect``), the child
    failed to start, and the test asked the other server, which answered ``/readyz``. These
    come from this worker's own slice below the ephemeral range, which nothing else takes,
    each checked free."""
    for _ in range(_OWN_PORTS):
        port = next(_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this worker's range")


class HttpServable(Protocol):
    """An inline upstream: what ``serving_upstream`` needs of it (FastMCP's ``http_app``)."""

    def http_app(self, path: str) -> Any: ...


class _Unsignalled(uvicorn.Server):
    """uvicorn leaving signals to the test runner. Its own handling installs the server's
    handler for SIGTERM and restores the one before on exit: with servers stopping out of
    order, a stopped server's handler stayed installed, and sse-starlette, which finds the
    server through that handler, then ended every later SSE stream in the process at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def serving(app: ASGIApp, sock: socket.socket | None = None, **options: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on loopback (on ``sock`` if given); yield its base URL.

    ``options`` go to ``uvicorn.Config`` (``ssl_certfile`` and ``ssl_keyfile`` make it https).
    """
    sock = sock or free_socket()
    port = sock.getsockname()[1]
    scheme = "https" if options.get("ssl_certfile") else "http"
    server = _Unsignalled(uvicorn.Config(app, log_level="warning", lifespan="on", **options))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(STARTUP_BOUND):
                while not server.started:
                    await anyio.sleep(0.005)
            try:
                yield f"{scheme}://127.0.0.1:{port}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


Intercept = Callable[[Scope, dict[str, Any], Send], Awaitable[bool]]
"""Given a POST's scope, its JSON-RPC message and ``send``: True if it answered it itself."""


def intercepted(server: FastMCP, intercept: Intercept) -> ASGIApp:
    """``server`` over Streamable HTTP (at ``/mcp``), each POST's message first offered to
    ``intercept``: an upstream that misbehaves on the calls a test picks, and is FastMCP for
    the rest."""
    app = server.http_app(path="/mcp")

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if await intercept(scope, json.loads(body), send):
            return None
        unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return unread.pop() if unread else await receive()

        return await app(scope, replayed, send)

    return upstream


@asynccontextmanager
async def serving_upstream(server: HttpServable, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Serve an inline upstream (FastMCP, or ``recorder.build``'s) over Streamable HTTP; yield
    its ``/mcp`` URL."""
    async with serving(server.http_app(path="/mcp"), sock) as base:
        yield f"{base}/mcp"


async def ready(port: int, bound: float = 30) -> None:
    """Wait (at most ``bound`` seconds) until a gateway process on ``port`` answers ``/readyz``."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        with anyio.fail_after(bound):
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/readyz")).status_code == 200:
                        return
                await anyio.sleep(0.05)


@asynccontextmanager
async def child_process(
    args: list[str], env: Mapping[str, str], log: Path | None = None
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A child process (its output to ``log`` when given), stopped with SIGTERM (so an SDK in
    it flushes) and reaped, bounded, on the way out."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("wb")) if log is not None else None
        child = subprocess.Popen(args, env=dict(env), stdout=out, stderr=subprocess.STDOUT if out else None)
        try:
            yield child
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                # Waited for off the event loop: a receiver in this process must keep
                # answering the child's last exports while it exits.
                with anyio.CancelScope(shield=True):
                    try:
                        await anyio.to_thread.run_sync(child.wait, 20)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        await anyio.to_thread.run_sync(child.wait, 10)


@asynccontextmanager
async def gateway_process(data: Mapping[str, Any], directory: Path) -> AsyncIterator[str]:
    """``agent-gateway serve`` on ``data`` (written to ``directory``/gateway.yaml) as its own
    process, as deployed (telemetry installed, ``/metrics`` served); yields its base URL."""
    async with gateway_child(data, directory) as (base, _):
        yield base


@asynccontextmanager
async def gateway_child(
    data: Mapping[str, Any], directory: Path, log: Path | None = None
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """``gateway_process``, with the process itself (to read its memory from /proc); its
    output to ``log`` when given."""
    port = free_port()
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump({**data, "server": {**data.get("server", {}), "port": port}}))
    command = [str(Path(sys.executable).parent / "agent-gateway"), "serve", "-c", str(path)]
    async with child_process(command, gateway_env(), log) as child:
        await ready(port)
        yield f"http://127.0.0.1:{port}", child


def config_of(data: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> GatewayConfig:
    return parse_config(dict(data), dict(environ or {}), source="test-config")


@dataclass
class RunningGateway:
    gateway: Gateway
    url: str
    """The gateway's MCP endpoint, e.g. http://127.0.0.1:PORT/mcp"""
    base: str


@asynccontextmanager
async def running_gateway(
    data: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    settle_timeout: float | None = None,
    chat_model: BaseChatModel | None = None,
) -> AsyncIterator[RunningGateway]:
    """A gateway built from ``data``, its upstreams connected, served over HTTP on loopback.
    Its audit trail and memory live in a directory of its own, removed when it stops."""
    with tempfile.TemporaryDirectory(prefix="gateway-") as home:
        gateway = Gateway(config_of(_own_state(data, Path(home)), environ), chat_model=chat_model)
        # The listener's own bounds too (header deadline, connection caps), as `serve` runs it.
        app = build_app(gateway)
        async with (
            gateway.running(settle_timeout=settle_timeout),
            serving(app, **listener_options(gateway)) as base,
        ):
            yield RunningGateway(gateway, f"{base}{gateway.config.server.path}", base)


def _own_state(data: Mapping[str, Any], home: Path) -> Mapping[str, Any]:
    """``data`` with its audit trail and memory (and so its tool pins) under ``home`` unless
    it names them: the defaults are relative to the working directory, which every in-process
    test gateway shares, so one test's pinned ``alpha__echo`` held back another's."""
    if "audit" not in data:  # each test gateway its own trail (one file per gateway process)
        data = {**data, "audit": {"path": str(home / "audit.jsonl")}}
    agent = dict(data.get("agent", {}))
    memory = dict(agent.get("memory", {}))
    if "path" in memory:
        return data
    memory["path"] = str(home / "conversations.sqlite")
    return {**data, "agent": {**agent, "memory": memory}}


@dataclass(frozen=True)
class RawAnswer:
    status: int
    body: bytes


async def answer_before_the_body_ends(
    url: str, headers: Mapping[str, str], body_start: bytes = b""
) -> RawAnswer:
    """POST to ``url`` on a raw socket: the headers and ``body_start``, never the rest of the
    body, then the answer. Only a server that answers before the body is whole answers at all
    (the caller bounds the wait)."""
    parsed = urlsplit(url)
    head = [
        f"POST {parsed.path} HTTP/1.1",
        f"Host: {parsed.netloc}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    async with await anyio.connect_tcp(parsed.hostname or "127.0.0.1", parsed.port or 80) as stream:
        await stream.send("\r\n".join([*head, "", ""]).encode() + body_start)
        received = BufferedByteReceiveStream(stream)
        status_line, *fields = (await received.receive_until(b"\r\n\r\n", 65536)).decode().split("\r\n")
        lengths = [int(f.split(":", 1)[1]) for f in fields if f.lower().startswith("content-length:")]
        body = await received.receive_exactly(lengths[0]) if lengths else b""
    return RawAnswer(int(status_line.split()[1]), body)


LOOPBACK_HEX = "0100007F"
"""127.0.0.1 as /proc/net/tcp writes it."""


class Seen:
    """What the upstream recorded, with a wait for the first event of each kind."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._first: dict[str, anyio.Event] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._of(event["event"]).set()

    def _of(self, kind: str) -> anyio.Event:
        return self._first.setdefault(kind, anyio.Event())

    async def first(self, kind: str) -> None:
        await self._of(kind).wait()


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) with a socket listening on ``port``."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def initialize(name: str, version: str = "2025-11-25") -> dict[str, Any]:
    """A handshake-era ``initialize`` request (id 0) of a client named ``name``, as a raw client
    writes it."""
    info = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": name, "version": "1"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": info}


def python_upstream(script: str, **extra: Any) -> dict[str, Any]:
    """Config for a stdio upstream running ``tests/servers/<script>`` with this interpreter."""
    return {"command": sys.executable, "args": [str(SERVERS / script)], **extra}


def outliving_its_input(upstream: dict[str, Any], seconds: int = 60) -> dict[str, Any]:
    """``upstream`` run by a shell that keeps running after the server exits on end of input,
    as a wrapper script may: only the gateway's own stop (signal the group, reap) ends it
    before ``seconds``. A test of stopping upstreams needs one: servers exit by themselves."""
    server = shlex.join([upstream["command"], *upstream["args"]])
    return {**upstream, "command": "sh", "args": ["-c", f"{server}; exec sleep {seconds}"]}


def npm_server(package: str, *args: str) -> dict[str, Any]:
    """Config for a stdio upstream running an installed npm reference server with node."""
    entry = NODE_MODULES / "@modelcontextprotocol" / package / "dist" / "index.js"
    return {"command": "node", "args": [str(entry), *args]}


def gateway_env() -> dict[str, str]:
    """The environment for a gateway subprocess: this venv's scripts first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@contextmanager
def asgi_in_a_thread(app: Any) -> Iterator[int]:
    """``app`` served by uvicorn in a thread of its own (for a synchronous command's test)."""
    sock = free_socket()
    running = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not running.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        running.should_exit = True
        thread.join(10)
        sock.close()
