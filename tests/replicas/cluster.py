"""Gateway replicas as deployed: ``agent-gateway serve`` processes started together on one
configuration, behind a real nginx doing per-request round robin."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import yaml

from tests.replicas.services import nginx_balancer
from tests.support import free_port, gateway_env

AGENT_GATEWAY = str(Path(sys.executable).parent / "agent-gateway")


@dataclass
class Cluster:
    replicas: list[str]
    """Each replica's base URL (``http://127.0.0.1:PORT``)."""
    balancer: str
    """nginx's base URL."""
    processes: list[subprocess.Popen[bytes]]
    logs: list[Path]

    @property
    def url(self) -> str:
        """The MCP endpoint behind the balancer."""
        return f"{self.balancer}/mcp"

    def endpoint(self, replica: int) -> str:
        return f"{self.replicas[replica]}/mcp"

    async def status(self, replica: int, token: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{self.replicas[replica]}/status", headers=headers)
        answer.raise_for_status()
        status: dict[str, Any] = answer.json()
        return status

    def kill(self, replica: int) -> None:
        """SIGKILL: the replica dies mid-whatever, as a lost node does."""
        self.processes[replica].send_signal(signal.SIGKILL)
        self.processes[replica].wait(10)

    def log(self, replica: int) -> str:
        return self.logs[replica].read_text(errors="replace")


def write_config(data: Mapping[str, Any], directory: Path, port: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    server = {**data.get("server", {}), "port": port}
    # nginx, on loopback, names each client in X-Forwarded-For (deploy/mcp-proxy.conf).
    server["connections"] = {"trusted_proxies": ["127.0.0.1"], **server.get("connections", {})}
    audit = {"path": str(directory / "audit.jsonl"), **data.get("audit", {})}
    path = directory / "gateway.yaml"
    # libyaml's dumper writes the same text: the pure-Python one took 4 s for a test's 8 MiB
    # of instructions, for each replica in turn, holding up the event loop meanwhile.
    path.write_text(yaml.dump({**data, "server": server, "audit": audit}, Dumper=yaml.CSafeDumper))
    return path


@asynccontextmanager
async def replicas(
    data: Mapping[str, Any], directory: Path, count: int = 2, env: Mapping[str, str] | None = None
) -> AsyncIterator[Cluster]:
    """``count`` replicas of ``data`` started at the same moment, each in its own directory
    (nothing shared but what the configuration names), behind nginx."""
    ports = [0] * count
    logs = [directory / f"replica-{i}.log" for i in range(count)]
    processes: list[subprocess.Popen[bytes]] = []
    """Every process started, to stop; ``serving[i]``: replica ``i``'s that serves."""
    serving: dict[int, subprocess.Popen[bytes]] = {}
    environ = {**gateway_env(), **(env or {})}

    async def start(i: int) -> None:
        # A port found free can be taken by another test's process before the replica binds
        # it ("address already in use", the replica exits): tried again on another.
        for _ in range(_TRIES):
            ports[i] = free_port()
            config = write_config(data, directory / f"replica-{i}", ports[i])
            with logs[i].open("wb") as out:
                command = [AGENT_GATEWAY, "serve", "-c", str(config)]
                process = subprocess.Popen(command, env=environ, stdout=out, stderr=subprocess.STDOUT)
            processes.append(process)
            if await _ready_unless_gone(ports[i], process):
                serving[i] = process
                return
            if "address already in use" not in logs[i].read_text(errors="replace"):
                raise RuntimeError(f"replica {i} exited at start-up ({process.returncode})")
        raise RuntimeError(f"replica {i} found no free port in {_TRIES} tries")

    try:
        async with anyio.create_task_group() as tg:
            for i in range(count):
                tg.start_soon(start, i)
        with nginx_balancer([f"127.0.0.1:{p}" for p in ports]) as balancer:
            started = [serving[i] for i in range(count)]
            yield Cluster([f"http://127.0.0.1:{p}" for p in ports], balancer, started, logs)
    except BaseException:
        _show_logs(logs)  # pytest shows what a failed test printed: the replicas' side of it
        raise
    finally:
        with anyio.CancelScope(shield=True):
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await anyio.to_thread.run_sync(process.wait, 20)
                if process.poll() is None:
                    process.kill()
                    await anyio.to_thread.run_sync(process.wait, 10)


_TRIES = 3


async def _ready_unless_gone(port: int, process: subprocess.Popen[bytes], bound: float = 30) -> bool:
    """Whether the replica ``process`` answers ``/readyz`` on ``port`` (within ``bound``
    seconds), False as soon as it has exited."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        with anyio.fail_after(bound):
            while process.poll() is None:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/readyz")).status_code == 200:
                        return True
                await anyio.sleep(0.05)
    return False


def _show_logs(logs: list[Path], lines: int = 80) -> None:
    for i, log in enumerate(logs):
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            print(f"--- replica {i}, the last {len(tail)} lines of its log ---", *tail, sep="\n")
