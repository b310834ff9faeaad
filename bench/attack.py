"""Hostile load against a real ``agent-gateway serve`` (issue 16): what one attacker achieves,
what a bystander client sees meanwhile, and what it costs the gateway.

Each attack runs against a fresh gateway process (open-file limit 1,024, a common default),
bounded in time, everything on loopback; the attacker connects from 127.0.0.2. For each:
what the attacker achieved, a bystander's ``tools/call`` p50/p99 (ms) and failures during
the attack, and the gateway's RSS (MB) and open descriptors before / during / after.

- ``slow-heads``: 1,500 sockets that send a partial request head and hold it;
- ``sessions``: a client limited to 60 requests/min opens sessions as fast as it can;
- ``long-calls``: 300 concurrent 10-second calls to one HTTP upstream (health checks
  every 2 s with a 2 s timeout, so a starved check marks the upstream down);
- ``long-names``: 600 calls naming distinct 1 MB tool names (log bytes written);
- ``big-bodies``: a 4 MiB notification holding a million ``{}``, once a second;
- ``patterns``: 8 concurrent calls at a time whose 41-character value fails the tool's
  ``^(a+)+$`` (backtracking in Python's ``re``);
- ``undecided-patterns``: the same against ``^(a|aa)+$``, which the bounded matcher cannot
  decide within its budget either (each such call spends it: 0.1 s);
- ``big-results``: one 40 MB result alone, then eight at once (80 MB answers): the peak RSS
  per MB served (the kernel's high-water mark), what the bound on bytes in flight refused;
- ``status-page``: 4 clients polling the status page's live part flat out, each asking for a
  stale catalog version (so the catalog comes with every answer), the catalog 3,000 tools
  from the stdio upstream. The page is open to anyone without auth (the README's example);
  here, behind bearer auth, the attacker's policy is ``admin``;
- ``dedicated-sessions``: 90 sessions of one client (its session cap is 100), 20 opened at a time and all kept open,
  each calling a stdio upstream with ``session: per_client`` (a small MCP server in plain
  Python, so each process is cheap): how many processes the gateway started. The bystander
  calls that upstream too;
- ``modern-dedicated`` (not an attack): one client with a token calling that upstream in the
  modern era, one call after another, for 10 s: its calls per second, and how many upstream
  processes answered them (a modern request is a session of its own);
- ``search-flood``: one client keeping 300 ``search_tools`` calls in flight, each matching
  every one of 5,000 tools, for 10 s; the bystander searches too (its own ``search_tools``);
- ``wide-searches``: one client keeping 64 ``search_tools`` calls in flight, each asking for
  50 of 60 tools whose schemas are ~260 KB (the largest real one: 268 KB), for 10 s;
- ``escaped-arguments``: 16 callers of ``tools/call`` whose 3.5 MB arguments are 1.75 million
  escaped quotes after 200 ``[`` (what admission reads before the parse steps over);
- ``closing-brackets``: 16 callers of bodies of 129 ``[`` and 3.5 million ``]`` (no request:
  refused as nested too deeply, after admission reads their depth);
- ``loud-errors``: 4 callers of a tool whose stdio upstream (with a credential in its
  environment) answers each call with a 30 MB error message;
- ``own-errors``: 16 callers of a tool whose stdio upstream answers ``-32000 bad input``: how
  often the gateway reconnected it;
- ``slow-bodies``: 300 connections, each sending 4 MiB - 1 byte of a body and never the
  last, held for 10 s: how many bodies the gateway holds, how many it refused;
- ``bad-token-flood``: ``initialize`` with a token the gateway does not know, back to back on
  64 connections from one address, for 10 s (each refused 401);
- ``unauthenticated-bodies``: 300 GETs and DELETEs without a token, each a chunked body begun
  and never sent on, held for 10 s: how many were refused (401) at once;
- ``unauthenticated-trickles``: 64 POSTs without a token from one address, each a declared
  4 MiB body begun and never sent on (opened again once answered), for 10 s: how long that
  address's ``/healthz`` took meanwhile;
- ``big-initialize``: 100 sessions (the client's cap), each opened by an ``initialize`` of
  ~900 KB of small JSON values in its capabilities, all kept open;
- ``many-addresses``: the README's example (no auth), the attacker on 100 loopback addresses
  (each an anonymous client of its own), each opening 100 sessions (its cap) with a 6 KB
  ``initialize``, never ending them, then 20 addresses more opening sessions as fast as they
  are answered for 10 s; the bystander opens a session for each call (as a CLI agent does);
- ``log-flood`` (an upstream's): 16 of the attacker's clients reading log lines, then the
  stdio upstream ``tests/servers/noisy.py`` writing 8,000 lines of 64 KB that no call owns as
  fast as its pipe takes them: the lines passed on, how long a call to that upstream waited
  behind them, and the gateway's RSS;
- ``list-churn`` (an upstream's): that upstream saying its tools changed after each listing
  for 10 s: how often the gateway listed it, how many ``list_changed`` one client was told;
- ``huge-listing`` (an upstream's): the stdio upstream ``tests/servers/hostile_listings.py``
  listing a million tiny tools in one page (56 MB) at each connection, for 40 s;
- ``many-calls``: one ``ask_agent`` run whose model (the attacker's own, through sampling with
  tools) answers each turn with 10,000 tool calls: how long the run took, how large the
  requests it was sent grew;
- ``fat-replies``: one modern-era run whose model (the JSON envelope) answers each turn with a call of
  3.5 MB of arguments: the largest turn it was sent, what the conversation store holds after;
- ``thread-flood``: one client's ``ask_agent`` runs, 8 at a time for 20 s, each on a new
  conversation, its own model (sampling) answering each with 64 KB: the threads and bytes
  the conversation store (SQLite, the default) holds after. Its run budget (60 a minute by
  default) is lifted, to reach in seconds what the default reaches in minutes;
- ``given-up-calls`` (an upstream's): batches of 32 handshake-era calls answered with a stream
  that drips and never ends, given up at their 2 s timeout, for 10 s: the streams still open
  upstream after, and the gateway's descriptors;
- ``resumption-storm`` (an upstream's): 16 handshake-era calls answered with a stream that ends at
  once with ``retry: 0``, as does every resumption of it, for their 5 s: the resumptions;
- ``endless-events`` (an upstream's): 16 modern-era calls answered with one SSE event of 100 MiB
  never ended: the gateway's peak RSS.

``--before REV`` runs the same attacks against the code at git revision REV (a worktree made
under /tmp, run with this venv), for the table in bench/README.md::

    .venv/bin/python bench/attack.py [--before cc6405a] [--only slow-heads,sessions]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parents[1]
ATTACKER, BYSTANDER = "attacker-token-0123456789", "bystander-token-0123456789"
UPSTREAM = """
import asyncio, functools, json, sys
from typing import Annotated
import uvicorn
from fastmcp import FastMCP
from pydantic import Field
server = FastMCP("slow")

@server.tool
def spell(word: Annotated[str, Field(pattern=r"^(a+)+$")]) -> str:
    return word

@server.tool
def stammer(word: Annotated[str, Field(pattern=r"^(a|aa)+$")]) -> str:
    return word

@server.tool
def echo(text: str) -> str:
    return text

@server.tool
async def wait(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"

@server.tool
def big(megabytes: int) -> str:
    return "x" * (megabytes * 2**20)

@functools.cache
def _big_result(megabytes: int) -> bytes:
    text = json.dumps("x" * (megabytes * 2**20))
    result = (
        '{"content": [{"type": "text", "text": %s}], "structuredContent": {"result": %s}, '
        '"isError": false, "resultType": "complete"}'
    )
    return (result % (text, text)).encode()

def _answer(body: bytes) -> bytes | None:
    # big's answer, serialised once: FastMCP serialising eight 80 MB answers at once would
    # block this upstream for seconds, and its health checks would mark it down.
    request = json.loads(body) if body.startswith(b"{") else {}
    params = request.get("params") or {}
    if request.get("method") != "tools/call" or params.get("name") != "big":
        return None
    result = _big_result(params["arguments"]["megabytes"])
    return b'{"jsonrpc": "2.0", "id": %s, "result": %s}' % (json.dumps(request["id"]).encode(), result)

# drip, storm and endless are answered below FastMCP with a stream (streamed_attacks).
for _name in ("drip", "storm", "endless"):
    server.tool(lambda: "never sent", name=_name)
_streams = {"dripping": 0, "resumptions": 0}

@server.tool
def streams() -> dict:
    return _streams

SSE = [(b"content-type", b"text/event-stream")]

async def _streamed(body: bytes, receive, send) -> bool:
    request = json.loads(body) if body.startswith(b"{") else {}
    name = (request.get("params") or {}).get("name")
    if request.get("method") != "tools/call" or name not in ("drip", "storm", "endless"):
        return False
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    if name == "storm":  # ended at once, to be resumed at once
        await send({"type": "http.response.body", "body": b"id: p1\\nretry: 0\\ndata: \\n\\n"})
        return True
    if name == "endless":  # one event of 100 MiB, never ended
        head = b'event: message\\ndata: {"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"'
        await send({"type": "http.response.body", "body": head % json.dumps(request["id"]).encode(), "more_body": True})
        for _ in range(100):
            await send({"type": "http.response.body", "body": b"x" * 2**20, "more_body": True})
    _streams["dripping"] += 1
    try:
        async def drip():
            while name == "drip":
                await send({"type": "http.response.body", "body": b": drip\\n\\n", "more_body": True})
                await asyncio.sleep(0.05)
        dripping = asyncio.ensure_future(drip())
        while (await receive())["type"] != "http.disconnect":
            pass
        dripping.cancel()
    finally:
        _streams["dripping"] -= 1
    return True

app = server.http_app(path="/mcp")

async def upstream(scope, receive, send):
    if scope["type"] == "http" and scope["method"] == "GET" and b"last-event-id" in dict(scope["headers"]):
        _streams["resumptions"] += 1
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": b"id: r%d\\nretry: 0\\n\\n" % _streams["resumptions"]})
        return
    if scope["type"] != "http" or scope["method"] != "POST":
        return await app(scope, receive, send)
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if await _streamed(body, receive, send):
        return
    if (answer := _answer(body)) is not None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return
    sent = False

    async def replayed():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    await app(scope, replayed, send)

uvicorn.run(upstream, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


TINY = """
import json, os, sys
more = [{"name": f"tool_{n}", "description": f"Tool number {n} of many, for a large catalog.",
         "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
        for n in range(int(os.environ.get("TINY_TOOLS", "0")))]
# Tools whose schemas are as large as a real one's can be (268 KB, the largest of 2,815).
more += [{"name": f"wide_{n}", "description": f"Wide tool number {n} of many, for a large catalog.",
          "inputSchema": {"type": "object", "properties": {f"field_{k}": {"type": "string",
              "description": f"Field {k} of the record. " + "x" * 2_000} for k in range(128)}}}
         for n in range(int(os.environ.get("TINY_WIDE", "0")))]
for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue
    method, result = request["method"], {}
    if method == "initialize":
        result = {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "tiny", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}, *more]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": request["params"]["arguments"].get("text", "")}],
                  "structuredContent": {"pid": os.getpid()}}
    print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}), flush=True)
"""
"""A stdio MCP server of a few lines: one process per client session costs little; it lists
``TINY_TOOLS`` more tools for a large catalog; each answer names the process that gave it."""


_SERVE = "import sys; from agent_gateway.cli import main; sys.exit(main(sys.argv[1:]))"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """A child process's RSS and descriptors, read from /proc."""

    pid: int

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def peak_mb(self) -> float:
        """The peak RSS since ``reset_peak`` (the kernel's own high-water mark, not a sample)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_seconds(self) -> float:
        """User and system CPU time spent so far (``/proc/PID/stat``, in clock ticks)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def children(self) -> int:
        try:
            return len(Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split())
        except OSError:
            return -1

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1


@dataclass
class Row:
    attack: str
    code: str
    achieved: str
    p50: float | None
    p99: float | None
    failures: int
    rss: tuple[float, float, float]
    fds: tuple[int, int, int]


@dataclass
class Bystander:
    """A well-behaved client calling ``echo`` in a loop during an attack."""

    tool: str = "slow__echo"
    arguments: dict[str, Any] = field(default_factory=lambda: {"text": "hi"})
    fresh: bool = False
    """Each call in a session of its own (its latency then counts the session's opening)."""
    latencies: list[float] = field(default_factory=list)
    failures: int = 0

    async def run(self, url: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            opening = time.perf_counter()
            try:
                async with (
                    httpx2.AsyncClient(headers={"Authorization": f"Bearer {BYSTANDER}"}, timeout=30) as http,
                    Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
                ):
                    while not stop.is_set():
                        started = opening if self.fresh else time.perf_counter()
                        try:
                            async with asyncio.timeout(15):
                                result = await client.call_tool(self.tool, self.arguments)
                            if result.is_error:
                                self.failures += 1
                            else:
                                self.latencies.append((time.perf_counter() - started) * 1e3)
                        except Exception:
                            self.failures += 1
                        await asyncio.sleep(0.1)
                        if self.fresh:
                            break
            except Exception:
                self.failures += 1
                await asyncio.sleep(0.5)

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def gateway(
    attack: str,
    src: Path,
    upstream_port: int,
    policy: dict[str, Any] | None = None,
    upstream: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[str, Process]]:
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="attack-"))
    (home / "tiny.py").write_text(TINY)
    config = {
        "server": {"port": port},
        "upstreams": {
            "slow": {
                "url": f"http://127.0.0.1:{upstream_port}/mcp",
                "health": {"interval": 2, "timeout": 2},
                "timeout": 120,
                **(upstream or {}),
            },
            "tiny": {
                "command": sys.executable,
                "args": [str(home / "tiny.py")],
                "session": "per_client",
                "env": {
                    "TINY_TOOLS": str(TINY_TOOLS.get(attack, 0)),
                    "TINY_WIDE": str(TINY_WIDE.get(attack, 0)),
                },
            },
            **(
                {"noisy": {"command": sys.executable, "args": [str(NOISY)]}}
                if attack in NOISY_ATTACKS
                else {}
            ),
            **(
                {"huge": {"command": sys.executable, "args": [str(HOSTILE_LISTINGS), HUGE_LISTING]}}
                if attack == "huge-listing"
                else {}
            ),
            **(
                {"odd": {"command": sys.executable, "args": [str(HOSTILE_LISTINGS), "good"], "env": ODD_ENV}}
                if attack in ODD_ATTACKS
                else {}
            ),
        },
        "agent": {"enabled": attack in AGENT_ATTACKS, "memory": {"path": str(home / "conversations.sqlite")}},
        "auth": {"mode": "none"}
        if attack in ANONYMOUS_ATTACKS
        else {
            "mode": "bearer",
            "tokens": [
                {"name": "attacker", "token": ATTACKER, "policy": "attacker"},
                *({"name": f"attacker{n}", "token": _attacker(n), "policy": "attacker"} for n in range(2, 5)),
                {"name": "bystander", "token": BYSTANDER},
            ],
            "policies": {"attacker": policy or {}},
        },
    }
    (home / "gateway.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(src)}
    log = (home / "stderr.log").open("wb")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    child = subprocess.Popen(  # noqa: ASYNC220 — started once, waited for with async sleeps
        [sys.executable, "-c", _SERVE, "serve", "-c", str(home / "gateway.yaml")],
        env=env,
        cwd=home,
        stderr=log,
        stdout=subprocess.DEVNULL,
        preexec_fn=limited,
    )
    try:
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 60
            while True:
                with suppress(httpx.TransportError, ValueError):
                    answer = await http.get(f"http://127.0.0.1:{port}/readyz")
                    body = answer.json()
                    missing = {u["name"] for u in body.get("missing", [])}
                    started = not body.get("starting")
                    if answer.status_code == 200 or (
                        attack in UNREADY_ATTACKS and started and missing == {"huge"}
                    ):
                        break
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"the gateway never got ready: its log is {home / 'stderr.log'}")
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", Process(child.pid)
    finally:
        child.terminate()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()
    shutil.rmtree(home, ignore_errors=True)  # kept when anything failed: its log says why


def _slow_socket(port: int) -> socket.socket | None:
    sock = socket.socket()
    sock.setblocking(False)
    try:
        sock.bind(("127.0.0.2", 0))
        sock.connect_ex(("127.0.0.1", port))
        return sock
    except OSError:
        sock.close()
        return None


async def slow_heads(url: str, proc: Process, seconds: float) -> str:
    port = httpx.URL(url).port or 80
    socks = [s for s in (_slow_socket(port) for _ in range(1500)) if s is not None]
    await asyncio.sleep(0.5)
    for sock in socks:
        with suppress(OSError):
            sock.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(2)
        for sock in socks:
            with suppress(OSError):
                sock.send(b"X-a: b\r\n")  # a header every few seconds
    alive = 0
    for sock in socks:
        try:
            alive += sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            alive += 1  # nothing to read: still held open
        except OSError:
            pass
        sock.close()
    return f"{alive}/{len(socks)} sockets still held after {seconds:g}s"


async def endless_heads(url: str, proc: Process, seconds: float) -> str:
    """50 connections, each sending one header's value without end (at most 1 GiB in all),
    inside the head deadline."""
    port = httpx.URL(url).port or 80
    socks = [s for s in (_slow_socket(port) for _ in range(50)) if s is not None]
    await asyncio.sleep(0.5)
    piece, taken, closed = b"a" * 65536, 0, set[int]()
    for sock in socks:
        with suppress(OSError):
            sock.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-endless: ")
    end = time.monotonic() + seconds
    while time.monotonic() < end and taken < 2**30 and len(closed) < len(socks):
        for n, sock in enumerate(socks):
            try:
                taken += sock.send(piece) if n not in closed else 0
            except BlockingIOError:
                pass
            except OSError:
                closed.add(n)
        await asyncio.sleep(0.01)
    for sock in socks:
        sock.close()
    return (
        f"{taken / 2**20:.0f} MiB of heads sent; {len(closed)}/{len(socks)} connections closed by the gateway"
    )


async def slow_calls(url: str, proc: Process, seconds: float) -> str:
    """Batches of 10 calls at once to a tool slow for its arguments (``wait`` runs out of its
    2 s timeout), for ``seconds``: 5 failures in a row open a circuit breaker that counts
    every timeout, for every client."""
    opened = 0
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            results = await asyncio.gather(
                *(client.call_tool("slow__wait", {"seconds": 10}) for _ in range(10))
            )
            opened += sum("circuit open" in str(r.content) for r in results)
    return f"{opened} of its calls refused by an open circuit"


async def sessions(url: str, proc: Process, seconds: float) -> str:
    headers = {
        "Authorization": f"Bearer {ATTACKER}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "a", "version": "1"},
        },
    }
    opened = 0
    async with httpx.AsyncClient(timeout=10) as http:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            answers = await asyncio.gather(
                *(http.post(url, json=body, headers=headers) for _ in range(20)), return_exceptions=True
            )
            opened += sum(1 for a in answers if isinstance(a, httpx.Response) and a.status_code == 200)
    return f"{opened} sessions opened in {seconds:g}s (limit 60 requests/min)"


def _initialize(values: int) -> bytes:
    """An ``initialize`` whose capabilities hold ``values`` small JSON values."""
    info = {
        "protocolVersion": "2025-06-18",
        "capabilities": {"experimental": {"x": {f"k{n}": n for n in range(values)}}},
        "clientInfo": {"name": "a", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": info}).encode()


async def many_addresses(url: str, proc: Process, seconds: float) -> str:
    """Anonymous sessions from 100 loopback addresses, 100 each (each address's cap), each
    ``initialize`` 6 KB of small values, never ended; then for ``seconds`` more opened from
    20 addresses more, as fast as they are answered (taking any room the bystander's leave)."""
    body = _initialize(480)
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    counts: dict[int, int] = {}

    held: dict[int, int] = {}

    async def one_address(n: int, times: int, until: float, counted: dict[int, int]) -> None:
        transport = httpx.AsyncHTTPTransport(local_address=f"127.0.{1 + n // 250}.{2 + n % 250}")
        async with httpx.AsyncClient(transport=transport, timeout=30) as http:
            for _ in range(times):
                if time.monotonic() > until:
                    return
                status = (await http.post(url, content=body, headers=headers)).status_code
                counted[status] = counted.get(status, 0) + 1

    for first in range(0, 100, 10):
        await asyncio.gather(*(one_address(first + n, 100, math.inf, counts) for n in range(10)))
    until = time.monotonic() + seconds
    await asyncio.gather(*(one_address(100 + n, 1_000_000, until, held) for n in range(20)))

    def told(counted: dict[int, int]) -> str:
        return ", ".join(f"{count} {status}" for status, count in sorted(counted.items()))

    return (
        f"10,000 initialize from 100 addresses: {told(counts)}; then {seconds:g}s from 20 more: {told(held)}"
    )


async def dedicated_sessions(url: str, proc: Process, seconds: float) -> str:
    sessions = 90  # below the client's own cap of 100 sessions
    served = refused = most = 0
    failed: list[str] = []
    opening, done = asyncio.Semaphore(20), asyncio.Event()

    async def one() -> None:
        try:
            await session()
        except Exception as exc:  # counted: the gateway refused or dropped it
            while isinstance(exc, BaseExceptionGroup):
                exc = exc.exceptions[0]
            failed.append(f"{type(exc).__name__}: {exc}"[:80])

    async def session() -> None:
        nonlocal served, refused
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            async with opening:
                result = await client.call_tool("tiny__echo", {"text": "x"})
            served, refused = served + (not result.is_error), refused + result.is_error
            await done.wait()  # the session kept open, as its process

    async def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, proc.children())
            await asyncio.sleep(0.1)

    async with asyncio.TaskGroup() as tg:
        for _ in range(sessions):
            tg.create_task(one())
        tg.create_task(watch())
        while served + refused + len(failed) < sessions:
            await asyncio.sleep(0.1)
        await asyncio.sleep(seconds)
        done.set()
    errors = f" ({len(failed)} failed: {failed[0]})" if failed else ""
    return f"{served} of {sessions} sessions served, {refused} refused{errors}; {most} processes at most"


async def modern_dedicated(url: str, proc: Process, seconds: float) -> str:
    """Not an attack: one client with a token, modern era, calling the ``per_client`` stdio
    upstream one call after another; how many calls, and how many processes that started."""
    calls, started = 0, set[int]()
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="auto") as client,
    ):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            result = await client.call_tool("tiny__echo", {"text": "x"})
            calls += not result.is_error
            started.add((result.structured_content or {}).get("pid", 0))
    return f"{calls} modern calls in {seconds:g}s ({calls / seconds:.0f}/s); {len(started)} upstream processes answered"


async def search_flood(url: str, proc: Process, seconds: float) -> str:
    """300 searches matching every tool kept in flight by one client: the index's queue."""
    answered = refused = 0
    deadline = time.monotonic() + seconds
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=120) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):

        async def one() -> None:
            nonlocal answered, refused
            while time.monotonic() < deadline:
                result = await client.call_tool(
                    "search_tools", {"query": "tool number of many for a catalog"}
                )
                if result.is_error:
                    refused += 1
                    await asyncio.sleep(0.01)
                else:
                    answered += 1

        await asyncio.gather(*(one() for _ in range(300)))
    return f"{answered} searches answered, {refused} refused at once"


async def wide_searches(url: str, proc: Process, seconds: float) -> str:
    """64 searches at a time (the client's ``max_concurrency``), each asking for 50 tools of
    ~260 KB schemas: what one answer holds, and how many were answered."""
    answered = refused = largest = 0
    deadline = time.monotonic() + seconds
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=120) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):

        async def one() -> None:
            nonlocal answered, refused, largest
            while time.monotonic() < deadline:
                result = await client.call_tool("search_tools", {"query": "wide tool of many", "limit": 50})
                if result.is_error:
                    refused += 1
                    await asyncio.sleep(0.01)
                else:
                    answered += 1
                    largest = max(largest, len(json.dumps(result.structured_content)))
                    await asyncio.sleep(0)

        await asyncio.gather(*(one() for _ in range(64)))
    return f"{answered} searches answered ({largest / 2**20:.1f} MB the largest), {refused} refused"


async def slow_bodies(url: str, proc: Process, seconds: float) -> str:
    """Bodies of 4 MiB - 1 byte sent on 300 connections, the last byte never: what is held."""
    port, size = httpx.URL(url).port or 80, 4 * 2**20
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ATTACKER}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    payload = head + b" " * (size - 1)  # one object, written on every connection
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        streams.append((reader, writer))
        writer.write(payload)
        with suppress(OSError):
            await writer.drain()

    await asyncio.gather(*(one() for _ in range(300)), return_exceptions=True)
    await asyncio.sleep(seconds)
    held = 0
    for reader, writer in streams:
        try:  # an answer (the 503), or the connection closed or reset: not held
            await asyncio.wait_for(reader.read(12), 0.05)
        except TimeoutError:
            held += 1
        except OSError:
            pass
        writer.close()
    return f"{held} bodies held unfinished, {len(streams) - held} refused (503, closed)"


async def unauthenticated_bodies(url: str, proc: Process, seconds: float) -> str:
    """300 GETs and DELETEs without a token, each with a chunked body begun (its first chunk's
    size line, one byte) and never sent on: how many were answered within a second, and how
    many were still unanswered after ``seconds``."""
    port = httpx.URL(url).port or 80
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one(method: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        streams.append((reader, writer))
        writer.write(
            f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n1".encode()
        )
        await writer.drain()

    await asyncio.gather(*(one(("GET", "DELETE")[n % 2]) for n in range(300)), return_exceptions=True)

    async def answered(reader: asyncio.StreamReader, within: float) -> bool:
        try:
            return bool(await asyncio.wait_for(reader.read(12), within))
        except (TimeoutError, OSError):
            return False

    first = await asyncio.gather(*(answered(r, 1.0) for r, _ in streams))
    await asyncio.sleep(seconds)
    waiting = [r for (r, _), done in zip(streams, first, strict=True) if not done]
    later = sum(await asyncio.gather(*(answered(r, 0.05) for r in waiting)))
    for _, writer in streams:
        writer.close()
    unanswered = len(waiting) - later
    return f"{sum(first)} of {len(streams)} answered within 1 s, {unanswered} unanswered {seconds:g} s later"


async def unauthenticated_trickles(url: str, proc: Process, seconds: float) -> str:
    """64 POSTs from 127.0.0.2 without a token, each declaring a 4 MiB body and sending one
    byte of it (a 401's drain waits 2 s for the rest), each opened again once answered; and
    a probe's ``/healthz`` from the same address every 0.1 s: its p50 / p99, and how many
    took past a probe's 1 s."""
    target = httpx.URL(url)
    port, host = target.port or 80, target.netloc.decode()
    head = f"POST {target.path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {4 * 2**20}\r\n\r\n "
    end = time.monotonic() + seconds

    async def asked(request: str) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        try:
            writer.write(request.encode())
            return await reader.read()
        finally:
            writer.close()

    async def trickle() -> None:
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                await asked(head)

    async def probes() -> list[float]:
        took = list[float]()
        while time.monotonic() < end:
            began = time.monotonic()
            await asked(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
            took.append((time.monotonic() - began) * 1000)
            await asyncio.sleep(0.1)
        return took

    trickles = asyncio.gather(*(trickle() for _ in range(64)))
    took = await probes()
    await trickles
    took.sort()
    p50, p99 = took[len(took) // 2], took[min(len(took) - 1, int(0.99 * len(took)))]
    late = sum(t > 1000 for t in took)
    return f"its /healthz {p50:.0f} / {p99:.0f} ms p50 / p99, {late} of {len(took)} past 1 s"


async def big_initialize(url: str, proc: Process, seconds: float) -> str:
    """100 sessions opened by initialize requests of ~900 KB of small values each, kept open."""
    body = _initialize(75_000)
    headers = {
        "Authorization": f"Bearer {ATTACKER}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    async with httpx.AsyncClient(timeout=60) as http:
        answers = [await http.post(url, content=body, headers=headers) for _ in range(100)]
    opened = sum(a.status_code == 200 for a in answers)
    await asyncio.sleep(seconds)
    return f"{opened} sessions opened with {len(body) // 1024} KB initialize requests, {len(answers) - opened} refused"


async def thread_flood(url: str, proc: Process, seconds: float) -> str:
    """Agent runs on new conversations, 8 at a time, each answered by the client's model with
    64 KB: what the conversation store holds after."""
    final = json.dumps({"type": "final", "content": "x" * 65536})  # the sampling provider's envelope
    answer = types.TextContent(type="text", text=final)

    async def model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=answer, model="the attacker's")

    runs = failed = 0
    deadline = time.monotonic() + seconds
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http,
        Client(
            streamable_http_client(url, http_client=http), mode="legacy", sampling_callback=model
        ) as client,
    ):

        async def one() -> None:
            nonlocal runs, failed
            while time.monotonic() < deadline:
                query = {
                    "query": "remember this",
                    "conversation_id": f"c{runs + failed}-{time.monotonic_ns()}",
                }
                result = await client.call_tool("ask_agent", query)
                failed, runs = (failed + 1, runs) if result.is_error else (failed, runs + 1)

        await asyncio.gather(*(one() for _ in range(8)))
    threads, size = _store_held(proc.pid)
    return f"{runs} runs ({failed} failed); the store holds {threads} threads, {size:.1f} MB"


def _store_held(pid: int) -> tuple[int, float]:
    """The threads and MB the gateway's conversation store (in its working directory) holds."""
    store = Path(f"/proc/{pid}/cwd").resolve() / "conversations.sqlite"
    with sqlite3.connect(store) as db:
        (threads,) = db.execute("SELECT count(DISTINCT thread_id) FROM checkpoints").fetchone()
    return threads, sum(f.stat().st_size for f in store.parent.glob("conversations.sqlite*")) / 2**20


async def status_page(url: str, proc: Process, seconds: float) -> str:
    base = url.removesuffix("/mcp")
    served = 0

    async def poll(http: httpx.AsyncClient) -> None:
        nonlocal served
        while time.monotonic() < end:
            answer = await http.get(f"{base}/?part=live&catalog=stale")  # the catalog sent anew
            served += answer.status_code == 200

    end = time.monotonic() + seconds
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http:
        await asyncio.gather(*(poll(http) for _ in range(4)))
    return f"{served} pages with the whole catalog in {seconds:g}s (4 pollers)"


async def long_calls(url: str, proc: Process, seconds: float) -> str:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        results = await asyncio.gather(
            *(client.call_tool("slow__wait", {"seconds": seconds}) for _ in range(300)),
            return_exceptions=True,
        )
    ok = sum(1 for r in results if not isinstance(r, BaseException) and not r.is_error)
    texts = [str(r.content[0].text) if not isinstance(r, BaseException) else repr(r) for r in results]  # type: ignore[union-attr]
    refused = sum(1 for t in texts if "limit" in t)
    down = sum(1 for t in texts if "down" in t or "not connected" in t or "circuit" in t)
    return f"{ok} ran, {refused} refused at once, {down} failed with the upstream marked down"


async def long_names(url: str, proc: Process, seconds: float) -> str:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        for n in range(600):
            with suppress(Exception):
                await client.call_tool(f"{n:04d}" + "x" * (2**20 - 4), {})
    return "600 names of 1 MB sent"


async def _pattern_calls(url: str, tool: str, seconds: float) -> str:
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):

        async def one() -> None:
            while time.monotonic() < deadline:
                result = await client.call_tool(tool, {"word": "a" * 40 + "!"})
                kind = (
                    "refused by the upstream" if "should match" in str(result.content[0]) else "refused here"
                )
                kind = kind if result.is_error else "passed"
                outcomes[kind] = outcomes.get(kind, 0) + 1

        await asyncio.gather(*(one() for _ in range(8)))
    return ", ".join(f"{n} {kind}" for kind, n in sorted(outcomes.items())) or "no call answered"


async def patterns(url: str, proc: Process, seconds: float) -> str:
    return await _pattern_calls(url, "slow__spell", seconds)


async def undecided_patterns(url: str, proc: Process, seconds: float) -> str:
    return await _pattern_calls(url, "slow__stammer", seconds)


async def big_bodies(url: str, proc: Process, seconds: float) -> str:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {ATTACKER}",
    }
    flood = json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": [{}] * 1_000_000}},
        separators=(",", ":"),
    ).encode()
    sent = refused = 0
    async with httpx.AsyncClient(timeout=30) as http:
        init = await http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "a", "version": "1"},
                },
            },
            headers=headers,
        )
        session = {"Mcp-Session-Id": init.headers.get("mcp-session-id", "")}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            answer = await http.post(url, content=flood, headers=headers | session)
            sent += 1
            refused += answer.status_code >= 400
            await asyncio.sleep(1)
    return f"{sent} bodies of {len(flood) / 2**20:.1f} MiB sent, {refused} refused unparsed"


_CALLERS = r"""
import asyncio, json, sys, time, httpx
url, token, seconds, callers, kind, call = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "Authorization": "Bearer " + token, "Mcp-Protocol-Version": "2025-06-18"}
text = "[" * 200 + '\\"' * 1_750_000 if kind == "escaped" else "x" * 3_500_000
def body(n):
    if kind == "closing":  # no request at all: what admission reads of it is the cost
        return "[" * 129 + "]" * 3_500_000
    if kind == "call":  # a tool's name and arguments, as JSON
        name, arguments = json.loads(call)
        return json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
    return '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"slow__echo","arguments":{"text":"%s"}}}' % (n, text)
async def main():
    answered = 0
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=callers + 2)) as http:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
                "capabilities": {}, "clientInfo": {"name": "a", "version": "1"}}}
        session = {"Mcp-Session-Id": (await http.post(url, json=init, headers=headers)).headers["mcp-session-id"]}
        end = time.monotonic() + seconds
        async def caller(k):
            nonlocal answered
            i = 0
            while time.monotonic() < end:
                i += 1
                answer = await http.post(url, content=body(k * 10**6 + i), headers=headers | session)
                answered += answer.status_code == (400 if kind == "closing" else 200)
        await asyncio.gather(*(caller(k) for k in range(callers)))
    print(answered)
asyncio.run(main())
"""


async def _raw_callers(
    url: str, seconds: float, callers: int, body: dict[str, Any] | str, token: str = ATTACKER
) -> str:
    """``callers`` connections of one client writing ``body`` (its ``id`` 0, made each
    request's own; or ``GET /path``) again and again for ``seconds`` (``tests/servers/flood.py``),
    with ``token``. Returns the count of answers by status."""
    request = body if isinstance(body, str) else json.dumps(body)
    child = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "tests.servers.flood", url, str(callers), request],
        *["--seconds", str(seconds), "--token", token],
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    return out.decode().strip() or "?"


async def _callers(url: str, seconds: float, callers: int, kind: str, call: str = "") -> str:
    """``callers`` clients' worth of requests one after another for ``seconds``, from a process
    of their own: on this one's event loop the attacker's own JSON work would be the
    bystander's wait. ``kind``: ``tools/call`` of 3.5 MB arguments, ``plain`` text or
    ``escaped`` quotes after 200 ``[`` (every read before the parse steps over each escape);
    ``closing`` brackets instead of a request; or a ``call`` of ``[name, arguments]`` (JSON).
    Returns how many were answered (refused, for ``closing``)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CALLERS,
        url,
        ATTACKER,
        str(seconds),
        str(callers),
        kind,
        call,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    return out.decode().strip() or "?"


async def idle(url: str, proc: Process, seconds: float) -> str:
    """No attack: the bystander's figures alone, the baseline of the rows around it."""
    await asyncio.sleep(seconds)
    return "nothing"


async def call_flood(url: str, proc: Process, seconds: float) -> str:
    """One client's calls of a fast tool back to back on 64 connections, from a process of its
    own: with no rate limit set, what its share of the gateway leaves the others."""
    call = {"name": "slow__echo", "arguments": {"text": "hi"}}
    answers = await _raw_callers(
        url, seconds, 64, {"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": call}
    )
    return f"calls in {seconds:g}s on 64 connections: {answers}"


def _attacker(n: int) -> str:
    """The token of the ``n``-th attacking client (the first's is ``ATTACKER``)."""
    return ATTACKER if n == 1 else f"attacker{n}-token-0123456789"


async def token_floods(url: str, proc: Process, seconds: float) -> str:
    """Four clients (tokens of their own) each calling a fast tool back to back on 64
    connections: 256 calls at once, past the upstream's 200 places to wait for a turn
    while its pings come back late."""
    call = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "tools/call",
        "params": {"name": "slow__echo", "arguments": {"text": "hi"}},
    }
    answers = await asyncio.gather(*(_raw_callers(url, seconds, 64, call, _attacker(n)) for n in range(1, 5)))
    return f"calls in {seconds:g}s on 4 x 64 connections: " + "; ".join(answers)


async def ping_flood(url: str, proc: Process, seconds: float) -> str:
    """The same with ``ping``, the cheapest request a session may send."""
    answers = await _raw_callers(url, seconds, 64, {"jsonrpc": "2.0", "id": 0, "method": "ping"})
    return f"pings in {seconds:g}s on 64 connections: {answers}"


async def notice_flood(url: str, proc: Process, seconds: float) -> str:
    """The same with a notification (``notifications/roots/list_changed``), answered 202."""
    notice = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    return f"notifications in {seconds:g}s on 64 connections: {await _raw_callers(url, seconds, 64, notice)}"


async def get_flood(url: str, proc: Process, seconds: float) -> str:
    """The same with a GET of a path the gateway does not serve: a 404, what any request
    without a body costs (``/healthz``, the status page's refusals)."""
    answers = await _raw_callers(url, seconds, 64, "GET /no-such-page")
    return f"GETs in {seconds:g}s on 64 connections: {answers}"


async def bad_token_flood(url: str, proc: Process, seconds: float) -> str:
    """``initialize`` with a token the gateway does not know, on 64 connections from one
    address: each refused (401) before it names any client."""
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
    answers = await _raw_callers(url, seconds, 64, body, token="not-a-token-0123456789")
    return f"requests in {seconds:g}s on 64 connections: {answers}"


async def _arguments_flood(url: str, seconds: float, kind: str) -> str:
    """16 callers of ``tools/call`` with 3.5 MB of arguments each (the echo answers them back)."""
    return await _callers(url, seconds, 16, kind)


async def big_arguments(url: str, proc: Process, seconds: float) -> str:
    return f"{await _arguments_flood(url, seconds, 'plain')} calls of 3.5 MB arguments served, 16 at once"


async def escaped_arguments(url: str, proc: Process, seconds: float) -> str:
    served = await _arguments_flood(url, seconds, "escaped")
    return f"{served} calls of 3.5 MB arguments (1.75 M escaped quotes) served, 16 at once"


async def closing_brackets(url: str, proc: Process, seconds: float) -> str:
    served = await _arguments_flood(url, seconds, "closing")
    return f"{served} bodies of 129 opening brackets and 3.5 M closing ones refused, 16 at once"


async def big_results(url: str, proc: Process, seconds: float) -> str:
    """One 40 MB result alone for a client of each era, then eight at once (each an 80 MB
    answer: FastMCP sends the text twice, as content and as structuredContent): the peak RSS
    per MB, and what was served or refused by the bound on bytes in flight."""

    async def one(mode: str) -> str:
        try:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=120) as http,
                Client(streamable_http_client(url, http_client=http), mode=mode) as client,
            ):
                result = await client.call_tool("slow__big", {"megabytes": 40})
            return "refused" if result.is_error else "served"
        except Exception:
            return "failed"

    async def peak_of(calls: int, mode: str = "legacy") -> tuple[list[str], float]:
        await asyncio.sleep(0.5)
        proc.reset_peak()
        base = proc.rss_mb()
        outcomes = await asyncio.gather(*(one(mode) for _ in range(calls)))
        return outcomes, proc.peak_mb() - base

    alone = []
    for era, mode in (("handshake", "legacy"), ("modern", MODERN)):
        [outcome], peak = await peak_of(1, mode)
        alone.append(f"{era} {outcome} +{peak:.0f} MB ({peak / 80:.1f} per MB)")
    outcomes, peak_all = await peak_of(BIG_RESULTS)
    return (
        f"alone: {'; '.join(alone)}; {BIG_RESULTS} at once: {outcomes.count('served')} served, "
        f"{outcomes.count('refused')} refused, {outcomes.count('failed')} failed, peak +{peak_all:.0f} MB"
    )


MODERN = "2026-07-28"
BIG_RESULTS = 8


NOISY = ROOT / "tests" / "servers" / "noisy.py"
"""A raw stdio upstream that floods and churns on request (the code under test does not
matter to it: the same script serves both revisions)."""


@asynccontextmanager
async def _attacker_clients(url: str, count: int, on_log: Any = None) -> AsyncIterator[list[Client]]:
    """``count`` handshake-era clients of the attacker's, each with ``on_log`` for its lines."""
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for _ in range(count):
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=120)
            )
            client = Client(
                streamable_http_client(url, http_client=http), mode="legacy", logging_callback=on_log
            )
            clients.append(await stack.enter_async_context(client))
        yield clients


async def log_flood(url: str, proc: Process, seconds: float) -> str:
    """16 clients reading log lines; the stdio upstream then writes 8,000 of 64 KB that no call
    owns, as fast as its pipe takes them: how many reached the clients, and how long a call to
    that upstream waited behind them (its answer comes after the last line)."""
    heard = [0]

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard[0] += 1

    async with _attacker_clients(url, 16, on_log) as clients:
        await clients[0].call_tool("noisy__flood", {"lines": 8000, "size": 65536})
        started = time.monotonic()
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await clients[0].set_logging_level("debug")  # passed on to the upstream: the flood
        await clients[0].call_tool("noisy__echo", {"text": "read"})  # answered after its last line
        took = time.monotonic() - started
        await asyncio.sleep(seconds)
    return f"8,000 lines of 64 KB to 16 clients: {heard[0]:,} passed on; a call behind them answered after {took:.1f} s"


async def small_flood(url: str, proc: Process, seconds: float) -> str:
    """16 clients reading log lines; the stdio upstream then writes 300,000 lines of 100 bytes
    that no call owns, as fast as its pipe takes them: how many reached the clients, how long a
    call behind them waited, and the gateway's CPU seconds meanwhile."""
    heard = [0]

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard[0] += 1

    async with _attacker_clients(url, 16, on_log) as clients:
        await clients[0].call_tool("noisy__flood", {"lines": 300_000, "size": 100})
        cpu, started = proc.cpu_seconds(), time.monotonic()
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await clients[0].set_logging_level("debug")  # passed on to the upstream: the flood
        await clients[0].call_tool("noisy__echo", {"text": "read"})  # answered after its last line
        took, spent = time.monotonic() - started, proc.cpu_seconds() - cpu
        await asyncio.sleep(seconds)
    return (
        f"300,000 lines of 100 bytes to 16 clients: {heard[0]:,} passed on; a call behind them "
        f"answered after {took:.1f} s; the gateway's CPU meanwhile {spent:.1f} s"
    )


async def _streams_upstream(client: Client) -> dict[str, int]:
    return json.loads(client_text(await client.call_tool("slow__streams", {})))


async def _calls_at_once(client: Client, tool: str, count: int) -> list[str]:
    results = await asyncio.gather(*(client.call_tool(tool, {}) for _ in range(count)))
    return [client_text(r)[:160] for r in results]


async def given_up_calls(url: str, proc: Process, seconds: float) -> str:
    """Batches of 32 handshake-era calls at once, each answered with a stream that drips a
    comment every 50 ms and never ends, given up at their 2 s timeout, for ``seconds``: how
    many of their streams the upstream still had open a second after the last was given up."""
    async with _attacker_clients(url, 1) as [client]:
        end, calls = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            calls += len(await _calls_at_once(client, "slow__drip", 32))
        await asyncio.sleep(1)
        open_after = (await _streams_upstream(client))["dripping"]
    return f"{calls} calls given up; {open_after} of their streams still open upstream 1 s after"


async def resumption_storm(url: str, proc: Process, seconds: float) -> str:
    """16 handshake-era calls at once, each answered with a stream that ends at once with an
    event id and ``retry: 0``, as is every resumption of it, given up at their 5 s timeout:
    how often the gateway reopened them, and its CPU seconds meanwhile."""
    async with _attacker_clients(url, 1) as [client]:
        cpu = proc.cpu_seconds()
        await _calls_at_once(client, "slow__storm", 16)
        spent = proc.cpu_seconds() - cpu
        resumed = (await _streams_upstream(client))["resumptions"]
    return f"16 calls of 5 s: their streams reopened {resumed:,} times; the gateway's CPU {spent:.1f} s"


async def endless_events(url: str, proc: Process, seconds: float) -> str:
    """16 modern-era calls at once, each answered with one SSE event of 100 MiB (under
    ``max_message_bytes``) never ended, given up at their 10 s timeout: the gateway's peak RSS
    (the kernel's high-water mark) and what the calls were answered."""
    proc.reset_peak()
    before = proc.rss_mb()
    async with _attacker_clients(url, 1) as [client]:
        answers = await _calls_at_once(client, "slow__endless", 16)
    refused = sum("in flight" in answer for answer in answers)
    return f"peak RSS +{proc.peak_mb() - before:.0f} MB; {refused} of 16 refused by the bound in flight"


HOSTILE_LISTINGS = ROOT / "tests" / "servers" / "hostile_listings.py"
HUGE_LISTING = "one1000000"
"""A page of a million tiny tools (56 MB, three million JSON values), at every listing."""


ODD_ENV = {"LOUD_KEY": "sk-live-0123456789abcdef"}
"""The odd upstream's one credential: what its errors are scrubbed of."""
ODD_ATTACKS = {"loud-errors", "own-errors"}


async def loud_errors(url: str, proc: Process, seconds: float) -> str:
    """Four callers of a tool whose upstream (with a credential configured) answers each call
    with an error of 30 MB."""
    answered = await _callers(
        url, seconds, 4, "call", json.dumps(["odd__loud", {"chars": 30_000_000, "data": 10}])
    )
    return f"{answered} calls answered with a 30 MB error, 4 at once"


async def own_errors(url: str, proc: Process, seconds: float) -> str:
    """16 callers of a tool whose stdio upstream answers ``-32000 bad input``: how often the
    gateway reconnected that upstream (its session was read as closed)."""
    answered = await _callers(url, seconds, 16, "call", json.dumps(["odd__refuse", {}]))
    async with httpx.AsyncClient() as http:
        upstreams = (await http.get(url.replace("/mcp", "/readyz"))).json().get("upstreams", [])
    connections = next((u["connections"] for u in upstreams if u["name"] == "odd"), "?")
    return f"{answered} calls answered with -32000; the upstream connected {connections} times"


async def huge_listing(url: str, proc: Process, seconds: float) -> str:
    """The upstream ``huge`` lists a million tiny tools in one page, at its start and at each
    reconnection after its refusal: the gateway's CPU meanwhile (the bystander and the RSS as
    for every attack)."""
    cpu = proc.cpu_seconds()
    await asyncio.sleep(seconds)
    return f"the gateway's CPU: {proc.cpu_seconds() - cpu:.1f} s in {seconds:.0f} s"


async def list_churn(url: str, proc: Process, seconds: float) -> str:
    """The stdio upstream says its tools changed after each listing, for ``seconds``: how often
    the gateway listed it, and how many ``list_changed`` one client was told."""
    told = [0]

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told[0] += 1

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=120) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", message_handler=on_message) as client:
            await client.call_tool("noisy__churn", {"times": 1_000_000})
            await asyncio.sleep(seconds)
            await client.call_tool("noisy__churn", {"times": 0})
            listed = json.loads(client_text(await client.call_tool("noisy__listings", {})))
    return f"{len(listed) - 1:,} listings in {seconds:.0f} s; {told[0]:,} list_changed told to one client"


async def _one_run(url: str, model: Any, tools: bool, mode: str = "legacy") -> tuple[str, int, int]:
    """One ``ask_agent`` run of the attacker's in ``mode``, its model ``model`` (sampling, with
    the tools capability when ``tools``): how it ended, the model turns asked, the largest
    turn's bytes."""
    asked: list[int] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(len(params.model_dump_json()))
        return model()

    capabilities = types.SamplingCapability(tools=types.SamplingToolsCapability()) if tools else None
    ended = ""
    try:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {ATTACKER}"}, timeout=300) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(
                transport, mode=mode, sampling_callback=sample, sampling_capabilities=capabilities
            ) as client:
                result = await client.call_tool("ask_agent", {"query": "go", "conversation_id": "one"})
                ended = client_text(result)[:60]
    except Exception as exc:  # the SDK's client reads at most 1 MB of an SSE event
        ended = f"its result unreadable ({type(exc).__name__})"
    return ended, len(asked), max(asked, default=0)


async def many_calls(url: str, proc: Process, seconds: float) -> str:
    """One run whose model (the client's, with tools) answers each turn with 10,000 calls."""
    calls: list[types.SamplingMessageContentBlock] = [
        types.ToolUseContent(id=f"t{i}", name="slow__echo", input={"text": "hi"}) for i in range(10_000)
    ]
    started = time.monotonic()
    ended, turns, largest = await _one_run(
        url,
        lambda: types.CreateMessageResultWithTools(
            role="assistant", content=calls, model="m", stop_reason="toolUse"
        ),
        tools=True,
    )
    took = time.monotonic() - started
    return f"one run, {turns} turns of 10,000 calls in {took:.1f} s (largest request {largest / 2**20:.1f} MB): {ended}"


async def fat_replies(url: str, proc: Process, seconds: float) -> str:
    """One run whose model (the client's, the JSON envelope) answers each turn with a call of
    3.5 MB of arguments: the largest turn it was sent, what the conversation store holds."""
    call = json.dumps({"type": "tool_call", "name": "slow__echo", "args": {"text": "x" * 3_500_000}})
    ended, turns, largest = await _one_run(
        url,
        lambda: types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=call), model="m"
        ),
        tools=False,
        mode="auto",  # its turns in JSON answers: the SDK's client reads an SSE event of 1 MB at most
    )
    _, size = _store_held(proc.pid)
    return f"one run, {turns} turns, the largest {largest / 2**20:.1f} MB; the store holds {size:.0f} MB: {ended}"


def client_text(result: types.CallToolResult) -> str:
    block = result.content[0]
    return block.text if isinstance(block, types.TextContent) else ""


ATTACKS: dict[str, tuple[Callable[[str, Process, float], Awaitable[str]], float, dict[str, Any] | None]] = {
    "idle": (idle, 10.0, None),
    "call-flood": (call_flood, 10.0, None),
    "token-floods": (token_floods, 10.0, None),
    "ping-flood": (ping_flood, 10.0, None),
    "notice-flood": (notice_flood, 10.0, None),
    "get-flood": (get_flood, 10.0, None),
    "bad-token-flood": (bad_token_flood, 10.0, None),
    "slow-heads": (slow_heads, 15.0, None),
    "endless-heads": (endless_heads, 8.0, None),
    "slow-calls": (slow_calls, 10.0, None),
    "sessions": (sessions, 10.0, {"rate_limit": {"per_minute": 60, "burst": 10}}),
    "long-calls": (long_calls, 10.0, None),
    "long-names": (long_names, 0.0, {"tools": ["slow__*"]}),
    "big-bodies": (big_bodies, 10.0, None),
    "big-arguments": (big_arguments, 15.0, None),
    "escaped-arguments": (escaped_arguments, 15.0, None),
    "closing-brackets": (closing_brackets, 15.0, None),
    "loud-errors": (loud_errors, 15.0, None),
    "own-errors": (own_errors, 10.0, None),
    "slow-bodies": (slow_bodies, 10.0, None),
    "unauthenticated-bodies": (unauthenticated_bodies, 10.0, None),
    "unauthenticated-trickles": (unauthenticated_trickles, 10.0, None),
    "big-initialize": (big_initialize, 3.0, None),
    "big-results": (big_results, 0.0, None),
    "patterns": (patterns, 10.0, None),
    "undecided-patterns": (undecided_patterns, 10.0, None),
    "dedicated-sessions": (dedicated_sessions, 3.0, None),
    "modern-dedicated": (modern_dedicated, 10.0, None),
    "status-page": (status_page, 10.0, {"admin": True}),
    "search-flood": (search_flood, 10.0, None),
    "wide-searches": (wide_searches, 10.0, None),
    "many-addresses": (many_addresses, 10.0, None),
    "thread-flood": (thread_flood, 20.0, {"agent": {"runs_per_minute": 100_000}}),
    "log-flood": (log_flood, 10.0, None),
    "small-flood": (small_flood, 5.0, None),
    "list-churn": (list_churn, 10.0, None),
    "huge-listing": (huge_listing, 40.0, None),
    "many-calls": (many_calls, 0.0, {"agent": {"runs_per_minute": 100_000}}),
    "fat-replies": (fat_replies, 0.0, {"agent": {"runs_per_minute": 100_000}}),
    "given-up-calls": (given_up_calls, 10.0, None),
    "resumption-storm": (resumption_storm, 0.0, None),
    "endless-events": (endless_events, 0.0, None),
}
UNREADY_ATTACKS = {"huge-listing"}
"""The attacks on a gateway with an upstream never up (``huge``): waited for until every other is."""
NOISY_ATTACKS = {"log-flood", "small-flood", "list-churn"}
"""The attacks of an upstream's (``NOISY``, beside the others)."""
AGENT_ATTACKS = {"thread-flood", "many-calls", "fat-replies"}
"""The attacks that need ``ask_agent`` (off for the others: nothing of it loaded)."""
ANONYMOUS_ATTACKS = {"many-addresses"}
"""The attacks on the README's example, without auth (each address an anonymous client)."""
FRESH_BYSTANDER = {"many-addresses"}
"""The attacks whose bystander opens a session for each call (as a CLI agent does)."""

UPSTREAM_SETTINGS: dict[str, dict[str, Any]] = {
    "slow-calls": {"tool_timeouts": {"wait": 2}},
    "given-up-calls": {"protocol": "legacy", "tool_timeouts": {"drip": 2}},
    "resumption-storm": {"protocol": "legacy", "tool_timeouts": {"storm": 5}},
    "endless-events": {"tool_timeouts": {"endless": 10}},
}
"""The upstream's settings an attack needs beyond the others'."""
TINY_TOOLS = {"status-page": 3000, "search-flood": 5000, "wide-searches": 100}
TINY_WIDE = {"wide-searches": 60}
"""The tools of ~260 KB schemas the stdio upstream lists, where an attack needs them."""
"""The tools the stdio upstream lists beyond ``echo``, where an attack needs a large catalog."""
BYSTANDER_TOOL = {
    "dedicated-sessions": "tiny__echo",
    "modern-dedicated": "tiny__echo",
    "search-flood": "search_tools",
}
"""The tool the bystander calls where it is not ``slow__echo``."""
BYSTANDER_ARGUMENTS = {"search-flood": {"query": "tool number 7 of many"}}
"""Its arguments, where they are not ``{"text": "hi"}``."""


async def one_attack(name: str, code: str, src: Path, upstream_port: int) -> Row:
    attack, seconds, policy = ATTACKS[name]
    async with gateway(name, src, upstream_port, policy, UPSTREAM_SETTINGS.get(name)) as (url, proc):
        before = (proc.rss_mb(), proc.fds())
        bystander = Bystander(
            BYSTANDER_TOOL.get(name, "slow__echo"),
            BYSTANDER_ARGUMENTS.get(name, {"text": "hi"}),
            fresh=name in FRESH_BYSTANDER,
        )
        stop = asyncio.Event()
        watcher = asyncio.create_task(bystander.run(url, stop))
        await asyncio.sleep(1)
        samples: list[tuple[float, int]] = []

        async def sample() -> None:
            while not stop.is_set():
                samples.append((proc.rss_mb(), proc.fds()))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        try:
            achieved = await asyncio.wait_for(attack(url, proc, seconds), timeout=seconds + 120)
        except Exception as exc:
            achieved = f"attack ended: {type(exc).__name__}: {exc}"[:120]
        await asyncio.sleep(1)
        stop.set()
        await asyncio.gather(watcher, sampler, return_exceptions=True)
        after = (proc.rss_mb(), proc.fds())
        during = (max(s[0] for s in samples), max(s[1] for s in samples)) if samples else before
        return Row(
            name,
            code,
            achieved,
            bystander.percentile(0.5),
            bystander.percentile(0.99),
            bystander.failures,
            (before[0], during[0], after[0]),
            (before[1], during[1], after[1]),
        )


def worktree(rev: str) -> Path:
    where = Path(tempfile.gettempdir()) / f"attack-before-{rev}"
    if not where.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
            check=True,
            capture_output=True,
        )
    return where / "src"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| attack | code | what the attacker achieved | bystander p50 / p99 ms | bystander failures | RSS MB before / during / after | fds before / during / after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rss = " / ".join(f"{v:.0f}" for v in r.rss)
        fds = " / ".join(str(v) for v in r.fds)
        lines.append(
            f"| {r.attack} | {r.code} | {r.achieved} | {_ms(r.p50)} / {_ms(r.p99)} | {r.failures} | {rss} | {fds} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", help="also run against this git revision")
    parser.add_argument("--only", help="comma-separated attacks")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(ATTACKS)
    codes = [("this change", ROOT / "src")] + (
        [(f"before ({args.before})", worktree(args.before))] if args.before else []
    )
    upstream_port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="attack-upstream-"))
    script = scratch / "upstream.py"
    script.write_text(UPSTREAM)
    upstream = subprocess.Popen([sys.executable, str(script), str(upstream_port)], stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(200):
                with suppress(httpx.TransportError):
                    await http.get(f"http://127.0.0.1:{upstream_port}/mcp")
                    break
                await asyncio.sleep(0.1)
        rows = [await one_attack(name, code, src, upstream_port) for name in names for code, src in codes]
    finally:
        upstream.terminate()
        try:
            upstream.wait(10)
        except subprocess.TimeoutExpired:
            upstream.kill()
            upstream.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"$ {shlex.join([Path(sys.executable).name, *sys.argv])}\n")
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
