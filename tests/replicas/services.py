"""Real Redis, PostgreSQL and nginx servers for the replica tests, each started on a loopback
port in a temporary directory and stopped (and its files removed) on the way out.

The Debian packages are installed by ``scripts/setup`` (CI runs as root on Debian). PostgreSQL
refuses to run as root, so there it runs as the ``postgres`` user the package creates.
"""

from __future__ import annotations

import contextlib
import glob
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT, free_port

_BOUND = 30.0


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _BOUND
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port} after {_BOUND}s: {log.read_text()[-2000:]}")


def _wait_until_ready(pid_file: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the postmaster says it accepts connections, as ``pg_ctl -w`` waits: its port opens
    while it still replays its log, and a client then gets "the database system is starting up"
    (what a CI run met right after a start)."""
    deadline = time.monotonic() + _BOUND
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            lines = pid_file.read_text().splitlines()
            if len(lines) > 7 and lines[7].strip() == "ready":  # PM_STATUS_READY, line 8
                return
        time.sleep(0.05)
    raise TimeoutError(f"PostgreSQL not ready after {_BOUND}s: {log.read_text()[-2000:]}")


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``args`` started with its output to ``log`` (the child keeps its own descriptor)."""
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class Redis:
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = self.directory / "redis.log"
        args = [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
        ]  # fmt: skip
        self.process = _spawn(args, log)
        _wait_for_port(self.port, self.process, log)

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None

    def freeze(self) -> None:
        """Unreachable, its data kept: it answers nothing (SIGSTOP) until ``thaw``."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def redis_server() -> Iterator[Redis]:
    directory = Path(tempfile.mkdtemp(prefix="redis-"))
    server = Redis(free_port(), directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (scripts/setup installs it)")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@dataclass
class Postgres:
    """A cluster in ``directory`` (made by ``initdb`` on first start) on a loopback port."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://gateway:gateway-test@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        data = self.directory / "data"
        if not data.exists():
            self._init(data)
        postgres = [
            _postgres_bin("postgres"), "-D", str(data), "-p", str(self.port), "-h", "127.0.0.1",
            "-k", str(self.directory), "-c", "fsync=off", "-c", "max_connections=200",
        ]  # fmt: skip
        log = self.directory / "postgres.log"
        self.process = _spawn(_as_postgres(postgres), log)
        _wait_until_ready(data / "postmaster.pid", self.process, log)

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster: its clients cut off, as a crash or a
        failover would), waited for until the postmaster is gone. SIGTERM to ``runuser`` asked
        for a smart one, which waits for every client (the gateway's pool): past its bound the
        wrapper was killed and the postmaster lived on, so a start right after found its lock."""
        if self.process is None:
            return
        pid_file = self.directory / "data" / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            postmaster = os.pidfd_open(int(pid_file.read_text().split()[0]))
            try:
                signal.pidfd_send_signal(postmaster, signal.SIGINT)
                select.select([postmaster], [], [], _BOUND)  # readable once it has exited
            finally:
                os.close(postmaster)
        _stop(self.process)
        self.process = None

    def _init(self, data: Path) -> None:
        password = self.directory / "password"
        password.write_text("gateway-test\n")
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
            shutil.chown(password, "postgres", "postgres")
        init = [_postgres_bin("initdb"), "-D", str(data), "-U", "gateway", "--auth=scram-sha-256"]
        subprocess.run(
            _as_postgres([*init, f"--pwfile={password}"]), check=True, capture_output=True, timeout=120
        )


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A fresh cluster, started; its ``url`` has a password."""
    server = Postgres(free_port(), Path(tempfile.mkdtemp(prefix="postgres-")))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)


MCP_PROXY = ROOT / "deploy" / "mcp-proxy.conf"
"""How nginx passes MCP to the replicas: the deployed lines themselves (deploy/nginx.conf)."""
NGINX_CONF = """
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log {dir}/access.log;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream gateways {{
    {servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      include {proxy};
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx_balancer(backends: list[str]) -> Iterator[str]:
    """nginx doing per-request round robin over ``backends`` (``host:port``); yields its URL."""
    directory = Path(tempfile.mkdtemp(prefix="nginx-"))
    directory.chmod(0o755)  # its workers run as nobody when it is started as root
    port = free_port()
    servers = "\n    ".join(f"server {b} max_fails=0;" for b in backends)
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, servers=servers, port=port, proxy=MCP_PROXY))
    log = directory / "nginx.out"
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    process = _spawn([binary, "-c", str(conf), "-p", str(directory)], log)
    try:
        _wait_for_port(port, process, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process)
        shutil.rmtree(directory, ignore_errors=True)
