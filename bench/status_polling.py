"""The status page and the other GETs polled flat out, against a real ``agent-gateway serve``:
what a bystander MCP client's ``tools/call`` p50/p99 becomes while N pollers ask for one
endpoint without pause, the catalog large (``--tools``, 10,000 by default: a ~10 MB page).

For each code (this checkout, and ``--before REV`` as a worktree of that revision made under
/tmp) one gateway process is started (no auth: the README's example, where the page is open
to anyone), then for each endpoint: the bystander alone for ``--seconds`` (the baseline of
that row, in the same run), then with the pollers. The pollers come from 127.0.0.2 (one
anonymous client; ``--addresses K`` spreads them over K addresses, K clients; each endpoint's
from addresses of their own), the bystander
from 127.0.0.1. Printed: answers the pollers got (200 and 429), the MB they were sent, and the
bystander's p50/p99 ms alone and under the attack, with their ratio.

    .venv/bin/python bench/status_polling.py [--before d8fc9ee] [--only live,status] [--pollers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = {
    "live": "/?part=live&catalog=stale",  # the page's refresh, asking for the whole catalog
    "page": "/",
    "search": "/?part=catalog&q=no+such+tool",  # the search box, matching nothing (all looked through)
    "status": "/status",
    "metrics": "/metrics",
    "readyz": "/readyz",
    "healthz": "/healthz",
    "missing": "/no-such-page",  # a 404: what any request costs, for comparison
}
UPSTREAM = """
import json, os, sys
tools = [{"name": f"tool_{n}", "description": f"Tool number {n} of a large catalog. " + "word " * 60,
          "inputSchema": {"type": "object", "properties": {
              f"field_{k}": {"type": "string", "description": f"Field {k} of the record."} for k in range(8)}}}
         for n in range(int(os.environ["TOOLS"]) - 1)]  # with echo: the most one upstream may list
for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue
    method, result = request["method"], {}
    if method == "initialize":
        result = {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "big", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}, *tools]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "hi"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}), flush=True)
"""
_SERVE = "import sys; from agent_gateway.cli import main; sys.exit(main(sys.argv[1:]))"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Bystander:
    """One MCP client (raw JSON-RPC over the handshake era's HTTP: the SDK's client lists tools
    before each call of a tool it has not listed, which search mode hides) calling ``big__echo``
    one call after another, 10 ms apart."""

    latencies: list[float] = field(default_factory=list)
    failures: int = 0

    async def run(self, http: httpx.AsyncClient, seconds: float) -> None:
        self.latencies, self.failures = [], 0
        end = time.monotonic() + seconds
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "big__echo", "arguments": {}},
        }
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                answer = await http.post("/mcp", json=call, timeout=15)
                if answer.status_code != 200 or '"result"' not in answer.text:
                    raise RuntimeError(answer.text[:200])
                self.latencies.append((time.perf_counter() - started) * 1e3)
            except Exception:
                self.failures += 1
            await asyncio.sleep(0.01)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies) or [float("nan")]
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def session(base: str) -> AsyncIterator[httpx.AsyncClient]:
    """A handshake-era session of the bystander's, its requests carrying its id."""
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
        params = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bystander", "version": "1"},
        }
        opened = await http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
        )
        http.headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield http


@dataclass
class Polled:
    ok: int = 0
    limited: int = 0
    other: int = 0
    megabytes: float = 0.0


async def poll(base: str, path: str, pollers: int, addresses: range, seconds: float) -> Polled:
    polled = Polled()
    end = time.monotonic() + seconds

    async def one(http: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            try:
                answer = await http.get(base + path)
            except httpx.HTTPError:
                polled.other += 1
                continue
            polled.megabytes += len(answer.content) / 2**20
            if answer.status_code == 200:
                polled.ok += 1
            elif answer.status_code == 429:
                polled.limited += 1  # a hostile poller asks again at once, Retry-After or not
            else:
                polled.other += 1

    clients = [
        httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(local_address=f"127.0.0.{addresses[n % len(addresses)]}"),
            timeout=60,
        )
        for n in range(pollers)
    ]
    try:
        await asyncio.gather(*(one(http) for http in clients))
    finally:
        for http in clients:
            await http.aclose()
    return polled


@asynccontextmanager
async def gateway(src: Path, tools: int) -> AsyncIterator[str]:
    home = Path(tempfile.mkdtemp(prefix="status-polling-"))
    (home / "big.py").write_text(UPSTREAM)
    port = free_port()
    config = {
        "server": {"port": port},
        "upstreams": {
            "big": {"command": sys.executable, "args": [str(home / "big.py")], "env": {"TOOLS": str(tools)}}
        },
        "auth": {"mode": "none"},
        "telemetry": {"metrics": True},
        "agent": {"enabled": False},
    }
    (home / "gateway.yaml").write_text(yaml.safe_dump(config))
    log = (home / "stderr.log").open("wb")
    child = subprocess.Popen(  # noqa: ASYNC220 — started once, waited for with async sleeps
        [sys.executable, "-c", _SERVE, "serve", "-c", str(home / "gateway.yaml")],
        env={**os.environ, "PYTHONPATH": str(src)},
        cwd=home,
        stderr=log,
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 120
            while True:
                with suppress(httpx.TransportError):
                    if (await http.get(f"{base}/readyz")).status_code == 200:
                        break
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"the gateway never got ready: its log is {home / 'stderr.log'}")
                await asyncio.sleep(0.2)
        yield base
    finally:
        child.terminate()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()
    shutil.rmtree(home, ignore_errors=True)


async def measure(code: str, src: Path, args: argparse.Namespace) -> list[str]:
    rows = []
    async with gateway(src, args.tools) as base, session(base) as client:
        async with httpx.AsyncClient(timeout=60) as http:  # sizes, and the page rendered once
            sizes = {name: len((await http.get(base + path)).content) for name, path in ENDPOINTS.items()}
        for row, name in enumerate(args.only):
            # Each row's pollers clients of their own: a budget spent by one row's is not the next's.
            addresses = range(2 + row * args.addresses, 2 + (row + 1) * args.addresses)
            bystander = Bystander()
            await bystander.run(client, args.seconds)
            alone = (bystander.percentile(0.5), bystander.percentile(0.99), len(bystander.latencies))
            attack = asyncio.ensure_future(poll(base, ENDPOINTS[name], args.pollers, addresses, args.seconds))
            await bystander.run(client, args.seconds)
            polled = await attack
            p50, p99 = bystander.percentile(0.5), bystander.percentile(0.99)
            rows.append(
                f"| {name} ({sizes[name] / 2**20:.2f} MB) | {code} | {polled.ok} / {polled.limited} / {polled.other} "
                f"| {polled.megabytes:.0f} | {alone[0]:.1f} / {alone[1]:.1f} ({alone[2]}) "
                f"| {p50:.1f} / {p99:.1f} ({len(bystander.latencies)}, {bystander.failures} failed) "
                f"| {p50 / alone[0]:.1f}x / {p99 / alone[1]:.1f}x |"
            )
            print(rows[-1], flush=True)
    return rows


def worktree(rev: str) -> Path:
    path = Path(tempfile.gettempdir()) / f"status-polling-{rev}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True)
    return path / "src"


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", help="a git revision to measure too, in the same run")
    parser.add_argument("--only", default=",".join(ENDPOINTS), type=lambda s: s.split(","))
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--addresses", type=int, default=1)
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(f"$ {' '.join(sys.argv)}")
    print(
        "| endpoint (answer) | code | pollers' answers 200 / 429 / other | MB sent to pollers "
        "| bystander alone p50 / p99 ms (calls) | under attack p50 / p99 ms (calls) | ratio p50 / p99 |"
    )
    print("|---|---|---|---:|---|---|---|")
    codes = [("this checkout", ROOT / "src")]
    if args.before:
        codes.append((f"before (`{args.before}`)", worktree(args.before)))
    for code, src in codes:
        await measure(code, src, args)


if __name__ == "__main__":
    asyncio.run(main())
