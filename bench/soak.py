"""Soak: mixed load through agent-gateway for a while, one upstream flapping; count what went wrong.

The gateway runs as ``agent-gateway serve`` in a process of its own (its RSS and open file
descriptors are read from ``/proc``, its pending calls, sessions and asyncio tasks from its
``/status``), in front of two upstreams:

- ``healthy``: ``tests/servers/counter.py`` over stdio (the gateway's child), tool ``increment``;
- ``flappy``: ``tests/servers/faulty.py http PORT`` in a process of this script's, which is
  killed (SIGKILL) every ``--flap-up`` seconds and restarted on the same port ``--flap-down``
  seconds later (``timeout: 5``, ``retry: {initial_delay: 0.1, max_delay: 1}``,
  ``health: {interval: 0.5, timeout: 1}``); tools ``ping`` and ``slow(seconds)``.

For ``--seconds`` (default 60), all at once, each with the official ``mcp.Client``:

- ``--callers`` sessions (default 8), each long-lived, calling ``healthy__increment``,
  ``flappy__ping`` and ``flappy__slow {"seconds": 0.2}`` at random, back to back;
- one canceller session: ``flappy__slow {"seconds": 2}`` or ``healthy__increment``, its scope
  cancelled after a random 0-0.5 s (counted ``cancelled`` when the call had not answered yet);
- one churner: opens a new session, makes one call, closes it, again and again.

Every call (and every session opening) is bounded by ``CALL_BOUND`` seconds: a bound hit is
a ``hang``, which must never happen. A caller whose call raised opens a new session. Outcomes
are counted by upstream: ok, ``isError`` by the kind its text names, exceptions by type,
cancelled, hang. Afterwards the script waits for ``flappy`` to be up again and the gateway to
settle, reads its figures again, stops it with SIGTERM, and checks that no process is left.

Exit status 1 if any call hung, the gateway died (or needed SIGKILL to stop), its figures
could not be read after the load, or a process was left behind.

Run from the repository root::

    .venv/bin/python bench/soak.py [--seconds 60] [--callers 8] [--flap-up 3] [--flap-down 1.5]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import Process
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `tests` importable
from tests.support import gateway_env, python_upstream

SERVERS = Path(__file__).resolve().parent.parent / "tests" / "servers"
FAULTY = SERVERS / "faulty.py"
GATEWAY = Path(sys.executable).parent / "agent-gateway"
STARTUP_BOUND = 30.0
"""Seconds the gateway (and its upstreams), or a restarted ``flappy``, may take to start."""
STOP_BOUND = 15.0
"""Seconds a process gets to exit after SIGTERM before it is killed."""
SETTLE_BOUND = 15.0
"""Seconds the gateway gets, after the load, to have no pending call and no live session."""
CALL_BOUND = 20.0
"""Seconds one call (or one session opening) may take before it counts as a hang."""
CLIENT_TIMEOUT = 60.0
"""The clients' own read timeout: above ``CALL_BOUND``, so the bound is what fires."""
LATER = 5.0
"""Seconds after the end figures at which the gateway's fds and RSS are read once more."""
RECONNECT_BOUND = 15.0
"""Seconds after a restart of ``flappy`` within which the gateway should be connected again."""
STATUS_POLL = 0.1
"""Seconds between the reads of the gateway's /status (and /proc) during the soak."""
CANCEL_DELAY = (0.0, 0.5)
"""The canceller cancels each call after a delay drawn uniformly from this range (seconds)."""
SAMPLE_CHARS = 240
"""Characters of each outcome's first text printed in the report."""
QUIET = ("uvicorn", "uvicorn.error", "uvicorn.access", "fastmcp", "mcp", "httpx", "agent_gateway")
SILENT = ("mcp.client.streamable_http",)
"""Loggers muted entirely: the client logs an SSE event that lands after its call was cancelled
(and its stream closed) as an error with a traceback; here that is expected."""

CALLER_MIX: tuple[tuple[str, dict[str, Any]], ...] = (
    ("healthy__increment", {}),
    ("flappy__ping", {}),
    ("flappy__slow", {"seconds": 0.2}),
)
CANCEL_MIX: tuple[tuple[str, dict[str, Any]], ...] = (
    ("flappy__slow", {"seconds": 2}),
    ("healthy__increment", {}),
)
CHURN_MIX: tuple[tuple[str, dict[str, Any]], ...] = (("healthy__increment", {}), ("flappy__ping", {}))

ERROR_KINDS = ("circuit open", "not connected", "connection closed", "health check", "no answer within")
"""``isError`` kinds, tried in this order on the error's text (a ``circuit open`` text quotes
the last failure, which names another kind); none matching: ``other``."""
EXPECTED_KINDS = {"not connected", "connection closed", "circuit open", "no answer within", "health check"}
"""What a call to ``flappy`` may be told while it flaps; ``healthy`` should only ever answer."""


# -- what the clients saw ----------------------------------------------------------------------


@dataclass
class Tally:
    """Outcomes by upstream (``healthy``, ``flappy``, or ``session`` for opening one)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)
    """The first text seen of each outcome that is not ok (for the report)."""
    longest: Counter[str] = field(default_factory=Counter)
    """The length of the longest text seen of each outcome that is not ok."""
    cancel_attempts: int = 0
    sessions_opened: int = 0
    """Sessions the churner opened (and closed)."""
    reopened: int = 0
    """Caller or canceller sessions opened again after a call raised."""

    def add(self, upstream: str, outcome: str, text: str = "") -> None:
        self.counts[upstream, outcome] += 1
        if outcome != "ok" and text:
            self.samples.setdefault(outcome, text[:SAMPLE_CHARS])
            self.longest[outcome] = max(self.longest[outcome], len(text))

    def total(self, outcome: str | None = None, upstream: str | None = None) -> int:
        return sum(
            n
            for (u, o), n in self.counts.items()
            if (outcome is None or o == outcome) and (upstream is None or u == upstream)
        )

    def outcomes(self) -> list[str]:
        return sorted({o for _, o in self.counts})


def error_kind(text: str) -> str:
    for kind in ERROR_KINDS:
        if kind in text:
            return kind
    return "other"


def new_client(url: str, mode: str) -> Client:
    return Client(url, mode=mode, read_timeout_seconds=CLIENT_TIMEOUT)


async def one_call(
    client: Client,
    tool: str,
    arguments: dict[str, Any],
    tally: Tally,
    cancel_after: float | None = None,
) -> bool:
    """Make one bounded call and count its outcome; False if it raised (the session may be gone)."""
    upstream = tool.split("__", 1)[0]
    result = None
    with anyio.move_on_after(CALL_BOUND) as bound:
        try:
            with anyio.CancelScope() as scope:
                if cancel_after is not None:
                    scope.deadline = anyio.current_time() + cancel_after
                result = await client.call_tool(tool, arguments)
        except Exception as exc:  # counted and reported, not fatal
            leaf = describe(exc)
            tally.add(upstream, f"exception: {type(leaf).__name__}", f"{tool}: {leaf}")
            return False
        if scope.cancelled_caught or result is None:
            tally.add(upstream, "cancelled")
            return True
        if result.is_error:
            text = " ".join(getattr(block, "text", "") for block in result.content)
            tally.add(upstream, f"isError: {error_kind(text)}", f"{tool}: {text}")
        else:
            tally.add(upstream, "ok")
        return True
    if bound.cancelled_caught:
        tally.add(upstream, "hang", f"{tool}: no outcome within {CALL_BOUND:g}s")
    return False


def describe(exc: BaseException) -> BaseException:
    """The exception itself, or the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def in_session(url: str, mode: str, tally: Tally, body: Callable[[Client], Awaitable[None]]) -> bool:
    """Open a client session, run ``body`` in it, close it; False if it could not be opened.

    Opening and closing are each bounded by ``CALL_BOUND`` (a hang if hit); their exceptions
    are counted under ``session``."""
    opened = False
    with anyio.CancelScope(deadline=anyio.current_time() + CALL_BOUND) as bound:
        try:
            async with new_client(url, mode) as client:
                opened = True
                bound.deadline = math.inf
                await body(client)
                bound.deadline = anyio.current_time() + CALL_BOUND
        except Exception as exc:  # counted and reported, not fatal
            leaf = describe(exc)
            where = "closing" if opened else "opening"
            tally.add("session", f"exception: {type(leaf).__name__}", f"{where} a session: {leaf}")
    if bound.cancelled_caught:
        where = "closing" if opened else "opening"
        tally.add("session", "hang", f"{where} a session: no outcome within {CALL_BOUND:g}s")
    return opened


async def keep_session(
    url: str, mode: str, tally: Tally, calls: Callable[[Client], Awaitable[None]], stop: anyio.Event
) -> None:
    """Run ``calls`` in a session until stopped; a new session after one ended by an error."""
    while not stop.is_set():
        if not await in_session(url, mode, tally, calls):
            await anyio.sleep(0.2)
        elif not stop.is_set():
            tally.reopened += 1


async def caller(url: str, mode: str, tally: Tally, rng: random.Random, stop: anyio.Event) -> None:
    """One long-lived session calling the mix back to back; a new session after a call raised."""

    async def calls(client: Client) -> None:
        while not stop.is_set():
            tool, arguments = rng.choice(CALLER_MIX)
            if not await one_call(client, tool, arguments, tally):
                return

    await keep_session(url, mode, tally, calls, stop)


async def canceller(url: str, mode: str, tally: Tally, rng: random.Random, stop: anyio.Event) -> None:
    """One session starting calls and cancelling each after a short random delay."""

    async def calls(client: Client) -> None:
        while not stop.is_set():
            tool, arguments = rng.choice(CANCEL_MIX)
            tally.cancel_attempts += 1
            if not await one_call(client, tool, arguments, tally, cancel_after=rng.uniform(*CANCEL_DELAY)):
                return

    await keep_session(url, mode, tally, calls, stop)


async def churner(url: str, mode: str, tally: Tally, rng: random.Random, stop: anyio.Event) -> None:
    """Open a session, make one call, close it; again until stopped."""

    async def call(client: Client) -> None:
        tally.sessions_opened += 1
        tool, arguments = rng.choice(CHURN_MIX)
        await one_call(client, tool, arguments, tally)

    while not stop.is_set():
        if not await in_session(url, mode, tally, call):
            await anyio.sleep(0.2)


# -- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    """The resident set size (``VmRSS``) of ``pid``, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


TCP_STATES = {"01": "established", "06": "time-wait", "08": "close-wait", "0A": "listening"}


def tcp_sockets(pid: int) -> dict[str, tuple[int, int, str]]:
    """TCP sockets in ``pid``'s network namespace: inode → (local port, remote port, state)."""
    sockets: dict[str, tuple[int, int, str]] = {}
    for table in ("tcp", "tcp6"):
        with suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                sockets[inode] = (
                    int(local.rsplit(":", 1)[1], 16),
                    int(remote.rsplit(":", 1)[1], 16),
                    TCP_STATES.get(state, f"state {state}"),
                )
    return sockets


def fd_kinds(pid: int, gateway_port: int, flappy_port: int) -> Counter[str]:
    """``pid``'s open file descriptors by kind: TCP connections by peer and state, pipes, ..."""
    sockets = tcp_sockets(pid)
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            tcp = sockets.get(target[len("socket:[") : -1])
            if tcp is None:
                kinds["other socket"] += 1
            elif tcp[2] == "listening":
                kinds["listening socket"] += 1
            elif tcp[0] == gateway_port:
                kinds[f"client connection ({tcp[2]})"] += 1
            elif tcp[1] == flappy_port:
                kinds[f"connection to flappy ({tcp[2]})"] += 1
            else:
                kinds[f"other TCP ({tcp[2]})"] += 1
        elif target.startswith(("pipe:", "anon_inode:")):
            kinds[target.split(":", 1)[0] if target.startswith("pipe:") else target] += 1
        else:
            kinds["file"] += 1
    return kinds


def children_of(pid: int) -> list[int]:
    pids: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        with suppress(OSError):
            pids += [int(p) for p in path.read_text().split()]
    return pids


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): it is dead but not reaped yet.
    with suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1] != "Z"
    return False


async def stop_process(process: Process) -> bool:
    """SIGTERM, wait (bounded), SIGKILL if need be; True if SIGTERM was enough."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            with suppress(ProcessLookupError):
                process.terminate()
            with anyio.move_on_after(STOP_BOUND):
                await process.wait()
        if process.returncode is not None:
            return True
        with suppress(ProcessLookupError):
            process.kill()
        await process.wait()
    return False


class Flappy:
    """``faulty.py http PORT`` as a process of this script's, on one port across restarts."""

    def __init__(self, stderr: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.stderr = stderr
        self.process: Process | None = None
        self.pids: list[int] = []
        self.startup: list[float] = []
        """Seconds from spawning to listening, each start."""

    async def start(self) -> float:
        """Spawn it and wait until it listens; the ``time.monotonic()`` at which it did."""
        assert self.process is None
        began = time.monotonic()
        with self.stderr.open("ab") as errors:
            self.process = await anyio.open_process(
                [sys.executable, str(FAULTY), "http", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
        self.pids.append(self.process.pid)
        async with httpx.AsyncClient(timeout=0.5) as http:
            with anyio.fail_after(STARTUP_BOUND):
                while True:
                    if self.process.returncode is not None:
                        raise RuntimeError(f"faulty.py http exited with {self.process.returncode}")
                    try:
                        await http.get(f"http://127.0.0.1:{self.port}/")
                        break
                    except httpx.TransportError:
                        await anyio.sleep(0.05)
        listening = time.monotonic()
        self.startup.append(listening - began)
        return listening

    async def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.process is None:
            return
        with anyio.CancelScope(shield=True):
            with suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        self.process = None


@dataclass
class Sample:
    at: float
    state: str
    connections: int
    rss: float
    fds: int


@dataclass
class Flaps:
    kills: list[float] = field(default_factory=list)
    """``time.monotonic()`` of each SIGKILL."""
    listening: list[float] = field(default_factory=list)
    """``time.monotonic()`` at which each restarted ``flappy`` was listening."""


async def flap(flappy: Flappy, up: float, down: float, stop: anyio.Event, flaps: Flaps) -> None:
    """Kill ``flappy`` after ``up`` seconds, restart it ``down`` seconds later; until stopped.
    Returns with it running (a down phase in progress when stopped is finished first)."""
    while True:
        with anyio.move_on_after(up):
            await stop.wait()
        if stop.is_set():
            return
        await flappy.kill()
        flaps.kills.append(time.monotonic())
        await anyio.sleep(down)
        flaps.listening.append(await flappy.start())


def flappy_status(status: dict[str, Any]) -> dict[str, Any]:
    return next((u for u in status.get("upstreams", []) if u.get("name") == "flappy"), {})


async def watch(http: httpx.AsyncClient, pid: int, samples: list[Sample], stop: anyio.Event) -> None:
    """Read the gateway's /status and /proc figures every ``STATUS_POLL`` seconds until stopped."""
    while not stop.is_set():
        with suppress(httpx.HTTPError, ValueError):
            flappy = flappy_status((await http.get("/status")).json())
            with suppress(OSError):
                samples.append(
                    Sample(
                        time.monotonic(),
                        str(flappy.get("state")),
                        int(flappy.get("connections", 0)),
                        rss_mib(pid),
                        open_fds(pid),
                    )
                )
        await anyio.sleep(STATUS_POLL)


def detection_and_reconnect(samples: list[Sample], flaps: Flaps) -> tuple[list[float], list[float], int]:
    """Seconds from each kill until the gateway saw ``flappy`` not up (or reconnected), from
    each restart's listening until the gateway had a new connection up, and the restarts it
    did not reconnect to within ``RECONNECT_BOUND`` (sampled every ``STATUS_POLL`` s)."""
    detected: list[float] = []
    reconnected: list[float] = []
    missed = 0
    for i, killed in enumerate(flaps.kills):
        before = [s for s in samples if s.at <= killed]
        after = [s for s in samples if s.at > killed]
        base = before[-1].connections if before else 0
        seen = next((s for s in after if s.state != "up" or s.connections > base), None)
        if seen is not None:
            detected.append(seen.at - killed)
        if i >= len(flaps.listening):
            continue
        listening = flaps.listening[i]
        up = next((s for s in after if s.state == "up" and s.connections > base), None)
        if up is None or up.at - listening > RECONNECT_BOUND:
            missed += 1
        else:
            reconnected.append(max(0.0, up.at - listening))
    return detected, reconnected, missed


# -- the soak ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    seconds: float
    callers: int
    flap_up: float
    flap_down: float
    mode: str
    seed: int


@dataclass
class Figures:
    rss: float
    fds: int
    status: dict[str, Any]
    kinds: Counter[str] = field(default_factory=Counter)
    """The open file descriptors by kind (see ``fd_kinds``)."""


@dataclass
class Report:
    tally: Tally = field(default_factory=Tally)
    flaps: Flaps = field(default_factory=Flaps)
    samples: list[Sample] = field(default_factory=list)
    start: Figures | None = None
    end: Figures | None = None
    load_seconds: float = 0.0
    load_began: float = 0.0
    """``time.monotonic()`` at the start of the load."""
    ready_after: float | None = None
    """Seconds from the end of the load until /readyz said every upstream was up again."""
    settled_after: float | None = None
    died: int | None = None
    """The gateway's exit status if it exited before it was told to."""
    stopped_by_sigterm: bool = True
    exit_status: int | None = None
    healthy_pids: tuple[int | None, int | None] = (None, None)
    left: list[int] = field(default_factory=list)
    """Processes (gateway, its children, flappy) still alive after the shutdown."""
    log_levels: Counter[str] = field(default_factory=Counter)
    log_problems: Counter[str] = field(default_factory=Counter)
    """ERROR/CRITICAL messages and non-JSON lines (but traceback frames) of the gateway's stderr."""
    log_warnings: Counter[str] = field(default_factory=Counter)
    """The gateway's WARNING messages, digits masked and cut short, by count."""
    startup: list[float] = field(default_factory=list)
    failure: str | None = None
    """What went wrong after the load, when the end figures could not be read."""
    later: Figures | None = None
    """The figures ``LATER`` seconds after the end ones, the gateway idle meanwhile."""


def figures_of(pid: int, status: dict[str, Any], ports: tuple[int, int]) -> Figures:
    return Figures(rss_mib(pid), open_fds(pid), status, fd_kinds(pid, *ports))


async def get_status(http: httpx.AsyncClient) -> dict[str, Any]:
    return (await http.get("/status")).json()


async def until_ready(http: httpx.AsyncClient, process: Process) -> None:
    """Wait until the gateway answers /readyz with every upstream up."""
    with anyio.fail_after(STARTUP_BOUND):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"the gateway exited with {process.returncode}")
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            await anyio.sleep(0.1)


async def settled(http: httpx.AsyncClient) -> dict[str, Any]:
    """/status once nothing is pending and no session is live (or as it is after the bound)."""
    with anyio.move_on_after(SETTLE_BOUND):
        while True:
            status = await get_status(http)
            if status["pending_calls"] == 0 and status["sessions"]["live"] == 0:
                return status
            await anyio.sleep(0.1)
    return await get_status(http)


async def healthy_pid(url: str, mode: str) -> int | None:
    with suppress(Exception), anyio.fail_after(CALL_BOUND):
        async with new_client(url, mode) as client:
            result = await client.call_tool("healthy__pid", {})
            return int(getattr(result.content[0], "text", ""))
    return None


async def warm_up(url: str, mode: str) -> None:
    """One session calling each tool once, so the start figures are those of a warm gateway."""
    with anyio.fail_after(CALL_BOUND):
        async with new_client(url, mode) as client:
            for tool, arguments in (*CALLER_MIX, ("flappy__pid", {})):
                await client.call_tool(tool, arguments)


def read_log(path: Path, report: Report) -> None:
    """Count the gateway's log lines (JSON, one per line) by level; keep what looks wrong."""
    with suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                level, message = str(record.get("level")), str(record.get("message"))
            except (ValueError, AttributeError):
                # Not the gateway's logging: uvicorn's own, or a traceback. Keep its headline
                # and last lines (the traceback's frames are indented).
                report.log_levels["not JSON"] += 1
                if not line[:1].isspace() and not line.startswith("Traceback"):
                    report.log_problems[f"(not JSON) {line[:200]}"] += 1
                continue
            report.log_levels[level] += 1
            if level == "WARNING":
                report.log_warnings[re.sub(r"\d+", "#", message)[:100]] += 1
            if level in ("ERROR", "CRITICAL"):
                report.log_problems[f"{level} {record.get('logger')}: {message[:200]}"] += 1


async def soak(options: Options) -> Report:
    report = Report()
    rng = random.Random(options.seed)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        flappy = Flappy(Path(tmp) / "flappy.stderr")
        gw_port = free_port()
        config = {
            "server": {"transport": "http", "port": gw_port},
            "telemetry": {"log_format": "json"},
            "upstreams": {
                "healthy": python_upstream("counter.py"),
                "flappy": {
                    "url": flappy.url,
                    "timeout": 5,
                    "retry": {"initial_delay": 0.1, "max_delay": 1},
                    "health": {"interval": 0.5, "timeout": 1},
                },
            },
        }
        config_path = Path(tmp) / "gateway.yaml"  # JSON is YAML
        config_path.write_text(json.dumps(config))
        command = [
            str(GATEWAY),
            "--log-level",
            "warning",
            "serve",
            "-c",
            str(config_path),
            "--transport",
            "http",
            "--port",
            str(gw_port),
        ]
        gateway_log = Path(tmp) / "gateway.stderr"
        url = f"http://127.0.0.1:{gw_port}/mcp"
        gateway: Process | None = None
        gateway_children: list[int] = []
        try:
            await flappy.start()
            with gateway_log.open("wb") as errors:
                gateway = await anyio.open_process(
                    command, env=gateway_env(), stdout=subprocess.DEVNULL, stderr=errors
                )
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw_port}", timeout=10) as http:
                await until_ready(http, gateway)
                await warm_up(url, options.mode)
                first_healthy = await healthy_pid(url, options.mode)
                report.start = figures_of(gateway.pid, await settled(http), (gw_port, flappy.port))

                print(
                    f"soaking for {options.seconds:g}s: {options.callers} callers, 1 canceller, 1 churner, "
                    f"flappy up {options.flap_up:g}s / down {options.flap_down:g}s ...",
                    file=sys.stderr,
                    flush=True,
                )
                stop, stop_watch = anyio.Event(), anyio.Event()
                began = report.load_began = time.monotonic()
                async with anyio.create_task_group() as watching:
                    watching.start_soon(watch, http, gateway.pid, report.samples, stop_watch)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(flap, flappy, options.flap_up, options.flap_down, stop, report.flaps)
                        for _ in range(options.callers):
                            tg.start_soon(
                                caller, url, options.mode, report.tally, random.Random(rng.random()), stop
                            )
                        tg.start_soon(
                            canceller, url, options.mode, report.tally, random.Random(rng.random()), stop
                        )
                        tg.start_soon(
                            churner, url, options.mode, report.tally, random.Random(rng.random()), stop
                        )
                        await anyio.sleep(options.seconds)
                        stop.set()
                    report.load_seconds = time.monotonic() - began
                    # Still sampling: the last restart's reconnection is measured too.
                    print("load stopped; waiting for flappy and the gateway to settle ...", file=sys.stderr)
                    try:
                        quiet = time.monotonic()
                        await until_ready(http, gateway)
                        report.ready_after = time.monotonic() - quiet
                        await anyio.sleep(2 * STATUS_POLL)
                    except (TimeoutError, RuntimeError, OSError, httpx.HTTPError) as exc:
                        report.failure = f"after the load: {type(exc).__name__}: {exc}"
                    stop_watch.set()
                if gateway.returncode is not None:
                    report.died = gateway.returncode
                elif report.failure is None:
                    try:
                        second_healthy = await healthy_pid(url, options.mode)
                        report.healthy_pids = (first_healthy, second_healthy)
                        quiet = time.monotonic()
                        status = await settled(http)
                        report.settled_after = time.monotonic() - quiet
                        report.end = figures_of(gateway.pid, status, (gw_port, flappy.port))
                        await anyio.sleep(LATER)
                        report.later = figures_of(gateway.pid, await get_status(http), (gw_port, flappy.port))
                        gateway_children = children_of(gateway.pid)
                    except (TimeoutError, RuntimeError, OSError, httpx.HTTPError) as exc:
                        report.failure = f"after the load: {type(exc).__name__}: {exc}"
        finally:
            with anyio.CancelScope(shield=True):
                if gateway is not None:
                    if gateway.returncode is not None and report.died is None:
                        report.died = gateway.returncode
                    report.stopped_by_sigterm = await stop_process(gateway)
                    report.exit_status = gateway.returncode
                await flappy.kill()
                await anyio.sleep(0.5)  # the gateway's children are reaped by it or by init
                pids = [*([gateway.pid] if gateway else []), *gateway_children, *flappy.pids]
                report.left = [pid for pid in pids if pid_alive(pid)]
                read_log(gateway_log, report)
                report.startup = flappy.startup
    return report


# -- reporting ---------------------------------------------------------------------------------


def percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]

    return f"{at(50):.2f} / {max(ordered):.2f}"


def split(tally: Tally, outcome: str) -> str:
    total = tally.total(outcome)
    parts = [f"{u} {n}" for u in ("healthy", "flappy", "session") if (n := tally.counts[u, outcome])]
    return f"{total} ({', '.join(parts)})" if parts else str(total)


def start_end(report: Report, pick: Any, fmt: str = "{}") -> str:
    if report.start is None or report.end is None:
        return "n/a"
    a, b = pick(report.start), pick(report.end)
    return f"{fmt.format(a)} → {fmt.format(b)}"


def table(report: Report, options: Options) -> str:
    t = report.tally
    detected, reconnected, missed = detection_and_reconnect(report.samples, report.flaps)
    error_rows = [f"isError: {kind}" for kind in (*ERROR_KINDS, "other")]
    others = [o for o in t.outcomes() if o not in ("ok", "cancelled", "hang", *error_rows)]
    calls = t.total() - t.total(upstream="session")
    answered = t.total("ok") + sum(t.total(o) for o in error_rows)
    rows: list[tuple[str, str]] = [
        ("load, s (the last in-flight calls included)", f"{report.load_seconds:.1f}"),
        ("flappy up / down, s (between kill and restart)", f"{options.flap_up:g} / {options.flap_down:g}"),
        (
            "flappy killed / restarted",
            f"{len(report.flaps.kills)} / {len(report.flaps.listening)}",
        ),
        ("flappy start → listening, s (p50 / max)", percentiles(report.startup)),
        ("kill → gateway sees flappy down, s (p50 / max)", percentiles(detected)),
        ("restart listening → gateway reconnected, s (p50 / max)", percentiles(reconnected)),
        (f"restarts not reconnected within {RECONNECT_BOUND:g}s", str(missed)),
        ("tool calls made", str(calls)),
        ("answered (ok + isError)", f"{answered} ({answered / max(report.load_seconds, 1e-9):.0f}/s)"),
        ("ok", split(t, "ok")),
        *((row, split(t, row)) for row in error_rows),
        *((row, split(t, row)) for row in others),
        ("cancelled (of cancel attempts)", f"{split(t, 'cancelled')} of {t.cancel_attempts}"),
        (f"**hang** (no outcome within {CALL_BOUND:g}s)", split(t, "hang")),
        ("churn sessions opened and closed", str(t.sessions_opened)),
        ("sessions reopened after a call raised", str(t.reopened)),
        ("gateway RSS MiB, start → end", start_end(report, lambda f: f.rss, "{:.1f}")),
        ("gateway RSS MiB, peak during the soak", _peak(report, "rss")),
        ("gateway RSS MiB at 25 / 50 / 75 / 100 % of the load", _rss_trend(report)),
        ("gateway open fds, start → end", start_end(report, lambda f: f.fds)),
        ("gateway open fds, peak during the soak", _peak(report, "fds")),
        ("gateway open fds by kind, start → end", _kinds(report)),
        (
            f"gateway open fds / RSS MiB, {LATER:g}s after the end, idle",
            "n/a" if report.later is None else f"{report.later.fds} / {report.later.rss:.1f}",
        ),
        ("gateway pending_calls, start → end", start_end(report, lambda f: f.status["pending_calls"])),
        ("gateway live sessions, start → end", start_end(report, lambda f: f.status["sessions"]["live"])),
        (
            "gateway sessions opened / ended, end",
            "n/a"
            if report.end is None
            else f"{report.end.status['sessions']['opened']} / {report.end.status['sessions']['ended']}",
        ),
        ("gateway asyncio tasks, start → end", start_end(report, lambda f: f.status["tasks"])),
        ("gateway child processes, start → end", start_end(report, lambda f: f.status["child_processes"])),
        (
            "flappy up again after the load, s",
            "n/a" if report.ready_after is None else f"{report.ready_after:.1f}",
        ),
        (
            "gateway settled after that, s",
            "n/a" if report.settled_after is None else f"{report.settled_after:.1f}",
        ),
        ("healthy upstream pid, start → end", f"{report.healthy_pids[0]} → {report.healthy_pids[1]}"),
        (
            "gateway log lines by level",
            ", ".join(f"{k} {v}" for k, v in sorted(report.log_levels.items())) or "none",
        ),
        ("gateway died during the soak", "no" if report.died is None else f"**yes** (exit {report.died})"),
        (
            "gateway stopped by SIGTERM (exit status)",
            f"{'yes' if report.stopped_by_sigterm else '**no**, killed'} ({report.exit_status})",
        ),
        ("processes left after shutdown", str(len(report.left)) if not report.left else f"**{report.left}**"),
    ]
    lines = ["| figure | value |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def _kinds(report: Report) -> str:
    if report.start is None or report.end is None:
        return "n/a"
    a, b = report.start.kinds, report.end.kinds
    return ", ".join(f"{kind} {a[kind]} → {b[kind]}" for kind in sorted(a.keys() | b.keys()))


def _rss_trend(report: Report) -> str:
    """The RSS sampled last before each quarter of the load had passed: growing, or flat?"""
    marks: list[str] = []
    for quarter in (0.25, 0.5, 0.75, 1.0):
        until = report.load_began + quarter * report.load_seconds
        before = [s.rss for s in report.samples if s.at <= until]
        marks.append(f"{before[-1]:.1f}" if before else "n/a")
    return " / ".join(marks)


def _peak(report: Report, attr: str) -> str:
    values = [getattr(s, attr) for s in report.samples]
    if not values:
        return "n/a"
    return f"{max(values):.1f}" if attr == "rss" else str(max(values))


def findings(report: Report) -> list[str]:
    t = report.tally
    out: list[str] = []
    if t.total("hang"):
        out.append(f"{t.total('hang')} calls or session openings hung (no outcome within {CALL_BOUND:g}s)")
    if report.died is not None:
        out.append(f"the gateway died during the soak (exit {report.died})")
    if not report.stopped_by_sigterm:
        out.append("the gateway did not exit on SIGTERM and was killed")
    if report.left:
        out.append(f"processes left after shutdown: {report.left}")
    bad_healthy = [
        o for (u, o), n in t.counts.items() if u == "healthy" and n and o not in ("ok", "cancelled")
    ]
    if bad_healthy:
        out.append(f"calls to the healthy upstream failed: {', '.join(sorted(bad_healthy))}")
    unexpected = [
        o
        for (u, o), n in t.counts.items()
        if u == "flappy"
        and n
        and o not in ("ok", "cancelled")
        and o.removeprefix("isError: ") not in EXPECTED_KINDS
    ]
    if unexpected:
        out.append(f"calls to flappy got unexpected outcomes: {', '.join(sorted(unexpected))}")
    if report.failure is not None:
        out.append(report.failure)
    if report.end is not None:
        status = report.end.status
        if status["pending_calls"]:
            out.append(f"{status['pending_calls']} pending calls left in the gateway")
        if status["sessions"]["live"]:
            out.append(f"{status['sessions']['live']} sessions still live in the gateway")
    errors = report.log_levels["ERROR"] + report.log_levels["CRITICAL"]
    tracebacks = report.log_problems["(not JSON) ERROR:    Exception in ASGI application"]
    if errors or report.log_levels["not JSON"]:
        out.append(
            f"the gateway logged {errors} errors and {report.log_levels['not JSON']} other lines "
            f"({tracebacks} 'Exception in ASGI application')"
        )
    first, second = report.healthy_pids
    if first is not None and first != second:
        out.append(f"the healthy upstream's process changed ({first} → {second})")
    return out


# -- entry point -------------------------------------------------------------------------------


def quiet_logging() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the load runs (default 60)")
    parser.add_argument("--callers", type=int, default=8, help="long-lived caller sessions (default 8)")
    parser.add_argument("--flap-up", type=float, default=3.0, help="seconds flappy stays up (default 3)")
    parser.add_argument(
        "--flap-down",
        type=float,
        default=1.5,
        help="seconds flappy stays down before its restart (default 1.5)",
    )
    parser.add_argument(
        "--mode",
        default="auto",
        help="the clients' connect mode: auto (default), legacy, or a modern protocol version",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the random call mix and delays (default 1)"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.callers < 1 or args.flap_up <= 0 or args.flap_down < 0:
        parser.error(
            "--seconds and --flap-up must be positive, --callers at least 1, --flap-down not negative"
        )
    return Options(args.seconds, args.callers, args.flap_up, args.flap_down, args.mode, args.seed)


def main() -> int:
    options = parse_args()
    quiet_logging()
    report = anyio.run(soak, options)
    print(table(report, options))
    print()
    print(f"command: `{shlex.join(sys.orig_argv)}`")
    print(
        f"load: {options.callers} caller sessions (mcp.Client, mode={options.mode}) calling "
        + ", ".join(f"{tool} {json.dumps(args)}" for tool, args in CALLER_MIX)
        + " at random, back to back; 1 canceller ("
        + " or ".join(f"{tool} {json.dumps(args)}" for tool, args in CANCEL_MIX)
        + f", cancelled after {CANCEL_DELAY[0]:g}-{CANCEL_DELAY[1]:g}s); "
        "1 churner (new session, one call, close)"
    )
    print(
        "figures: start = after one warm-up session, before the load; end = after the load, once "
        "/readyz says every upstream is up and the gateway has no pending call and no live session "
        f"(bounded {SETTLE_BOUND:g}s); RSS and fds from /proc/<gateway pid>, sampled every "
        f"{STATUS_POLL:g}s with /status from the start of the load until flappy is up again after it"
    )
    if report.tally.samples:
        print("first text of each outcome:")
        for outcome, text in sorted(report.tally.samples.items()):
            cut = " ..." if len(text) < report.tally.longest[outcome] else ""
            print(f"- {outcome} (longest {report.tally.longest[outcome]} chars): {text}{cut}")
    if report.log_warnings:
        print("gateway log, warnings (digits masked, first 100 characters):")
        for message, n in report.log_warnings.most_common(8):
            print(f"- {n} x {message}")
    if report.log_problems:
        print("gateway log, errors and lines that are not JSON (traceback frames left out):")
        for line, n in report.log_problems.most_common(10):
            print(f"- {n} x {line}")
    problems = findings(report)
    print("findings: " + ("none" if not problems else ""))
    for problem in problems:
        print(f"- {problem}")
    t = report.tally
    failed = report.died is not None or not report.stopped_by_sigterm or report.left or report.failure
    return 1 if t.total("hang") or failed else 0


if __name__ == "__main__":
    sys.exit(main())
