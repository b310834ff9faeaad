"""How the catalog scales: start-up, ``tools/list`` pages, one upstream's change, ``search_tools``
latency and the gateway's memory at 1,000, 3,000 and 10,000 tools.

For each size (``--sizes``, upstreams x tools each) one child process hosts every upstream as
a real FastMCP Streamable-HTTP server (one uvicorn app mounting a FastMCP app per upstream at
``/u{i}/mcp``), with tool definitions harvested from real MCP servers
(``bench/data/tool_search/tools.json``, cycled) or, without that file, generated ones. Upstream
``u0`` also offers ``add_tool``, which adds a tool and sends ``tools/list_changed``.

The gateway runs as deployed, ``agent-gateway serve -c <generated yaml>`` in a child process
(HTTP on loopback), so its RSS is its own; the benchmark's official ``mcp`` clients run here.
Per size it is started several times against the same upstreams:

- ``before``: the code before (tool search by default: ``--before-ref``, a git worktree run with this venv's
  packages): start-up, the whole ``tools/list``, RSS;
- ``search.mode: off`` with each ``--page-sizes`` (the first is the main run): start-up, each
  page's latency following ``nextCursor``, the whole list, and (main run) a change of ``u0``
  timed until the client is told and the new tool is listed, and RSS;
- ``search.mode: on``: ``search_tools`` round trips, a change of ``u0`` timed until
  ``search_tools`` finds the new tool, and RSS.

In this process, over the same tools: ``Catalog.update`` plus the index update for one upstream
(no Gateway: a Catalog, a ToolSearch and a ToolListing fed synthetic Listings), the engine's
``ToolSearch.search`` alone, and FastMCP's ``BM25SearchTransform`` (a FastMCP server with the
same tools, its search tool called through ``fastmcp.Client`` in memory).

Run from the repository root::

    .venv/bin/python bench/catalog_scale.py [--sizes 10x100,30x100,100x100] [--page-sizes 100,500,1000]
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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import yaml
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.text import TextReceiveStream
from fastmcp import Client as FastMCPClient
from fastmcp import Context, FastMCP
from fastmcp.server.transforms.search import BM25SearchTransform
from fastmcp.tools.base import Tool
from fastmcp.utilities.lifespan import combine_lifespans
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPDeprecationWarning
from starlette.applications import Starlette
from starlette.routing import Mount

from agent_gateway.catalog import Catalog, CatalogChange
from agent_gateway.catalog_parts import Listing
from agent_gateway.config_files import parse_config
from agent_gateway.listing import ToolListing
from agent_gateway.naming import own_tool_names, public_name
from agent_gateway.search.engine import ToolSearch
from agent_gateway.search.tools import CALL_TOOL, SEARCH_TOOLS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `tests` importable
from tests.support import free_socket, serving

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
BIN = Path(sys.executable).parent

TOOLS_JSON = ROOT / "bench" / "data" / "tool_search" / "tools.json"
STARTUP_BOUND = 180.0
"""Seconds a gateway (or the upstreams' host) may take from spawn to ready."""
STOP_BOUND = 15.0
MEASURE_BOUND = 300.0
"""Seconds one measurement (a listing's rounds, the searches, the changes) may take."""
CALL_TIMEOUT = 60.0
CHANGE_BOUND = 30.0
"""Seconds one upstream's change may take to be told, listed or found."""
SEPARATOR = "__"
CHANGING = "u0"
"""The upstream that offers ``add_tool``."""
ADD_TOOL = "add_tool"
QUIET = ("mcp", "fastmcp", "httpx", "uvicorn", "uvicorn.error", "agent_gateway")

QUERIES = (
    "open a new issue about the login bug in our tracker",
    "list the merge requests waiting for my review",
    "post a message to the team channel",
    "who is on call right now",
    "acknowledge the incident that paged me",
    "restart the crashed pod in production",
    "scale the web deployment to five replicas",
    "show CPU usage of the database server for the last hour",
    "create a new droplet in the frankfurt region",
    "purge the CDN cache for our website",
    "add a DNS record for the new subdomain",
    "run a SQL query against the analytics database",
    "list the tables in the postgres database",
    "find documents in the orders collection where status is pending",
    "set a key with an expiry in the cache",
    "take a screenshot of the web page",
    "click the submit button on the form",
    "fill in the login form and submit it",
    "fetch the contents of this URL as markdown",
    "search the web for recent news about MCP",
    "crawl the docs site and extract all pages",
    "schedule a meeting with Alice tomorrow at 10",
    "send an email to the finance team with the report attached",
    "upload a file to my OneDrive",
    "what's on my calendar this week",
    "create a new page in the wiki with meeting notes",
    "move the card to done on the board",
    "assign the ticket to Bob",
    "refund the last payment from this customer",
    "create a new customer in the billing system",
    "send an SMS to this phone number",
    "list the errors reported in the last day",
    "show the recent exceptions for the checkout service",
    "query prometheus for request latency",
    "build the main branch on CI",
    "trigger the nightly jenkins job",
    "toggle the feature flag for beta users",
    "read the contents of the config file",
    "search for files named settings in the project directory",
    "show the git diff of my uncommitted changes",
    "commit the staged changes with a message",
    "remember that the user prefers dark mode",
    "what time is it in Tokyo",
    "create a storage bucket in azure",
    "list the virtual machines in the resource group",
    "add a row to the airtable base",
    "upsert vectors into the pinecone index",
    "get the dashboard for service latency in grafana",
    "create a deal in the CRM for Acme Corp",
    "list the members of the discord server",
)
"""Requests as users phrase them; cycled to ``--queries``."""


# -- tool definitions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolDef:
    """One tool as an upstream lists it."""

    name: str
    description: str
    schema: dict[str, Any]
    title: str | None = None
    annotations: dict[str, Any] | None = None

    def mcp(self, name: str | None = None) -> types.Tool:
        annotations = types.ToolAnnotations.model_validate(self.annotations) if self.annotations else None
        return types.Tool(
            name=name or self.name,
            title=self.title,
            description=self.description,
            input_schema=self.schema,
            annotations=annotations,
        )


ADD_TOOL_DEF = ToolDef(
    ADD_TOOL,
    "Register a new tool on this server and announce tools/list_changed to the client.",
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The new tool's name."},
            "description": {"type": "string", "description": "What the new tool does."},
        },
        "required": ["name", "description"],
    },
)


def harvested(path: Path) -> list[ToolDef]:
    """Every tool of ``tools.json`` (``{"servers": [{"tools": [...]}]}``), in file order."""
    data = json.loads(path.read_text())
    return [
        ToolDef(
            t["name"],
            t.get("description") or "",
            t.get("inputSchema") or {"type": "object"},
            t.get("title"),
            t.get("annotations"),
        )
        for server in data["servers"]
        for t in server["tools"]
    ]


_DOMAINS = {
    "tracker": ("issue", "project", "comment", "label", "milestone"),
    "chat": ("message", "channel", "thread", "reaction", "user"),
    "cloud": ("instance", "volume", "bucket", "firewall", "snapshot"),
    "database": ("table", "row", "index", "query", "collection"),
    "browser": ("page", "tab", "element", "screenshot", "cookie"),
    "billing": ("invoice", "payment", "customer", "refund", "subscription"),
    "monitoring": ("alert", "dashboard", "metric", "incident", "log"),
}
_VERBS = ("create", "get", "list", "update", "delete", "search", "archive", "export")
_PARAMS = {
    "id": "The identifier of the {thing}.",
    "project": "The project or workspace the {thing} belongs to.",
    "query": "Free-text search over {thing}s.",
    "limit": "How many {thing}s to return at most.",
    "cursor": "Where the previous page of {thing}s ended.",
    "title": "A short title for the {thing}.",
    "body": "The {thing}'s content, as Markdown.",
    "owner": "Who owns the {thing}.",
    "tags": "Labels attached to the {thing}.",
    "region": "The region the {thing} lives in.",
}


def generated() -> list[ToolDef]:
    """Plausible tools when no harvested set is at hand: 2-6 parameters, a sentence or two each."""
    rng = random.Random(15)
    defs: list[ToolDef] = []
    for domain, things in _DOMAINS.items():
        for thing in things:
            for verb in _VERBS:
                chosen = rng.sample(sorted(_PARAMS), rng.randint(2, 6))
                properties = {
                    p: {"type": "string", "description": _PARAMS[p].format(thing=thing)} for p in chosen
                }
                description = f"{verb.title()} a {thing} in the {domain} service."
                if rng.random() < 0.5:
                    description += f" Returns the {thing} as JSON, with its id and URL."
                schema = {"type": "object", "properties": properties, "required": chosen[:1]}
                defs.append(ToolDef(f"{domain}_{verb}_{thing}", description, schema))
    return defs


def catalog_of(defs: Sequence[ToolDef], upstreams: int, per: int) -> list[list[ToolDef]]:
    """Each upstream's tools: ``defs`` cycled; names made unique within an upstream; ``u0``'s
    last tool is ``add_tool``."""
    out: list[list[ToolDef]] = []
    k = 0
    for i in range(upstreams):
        names: set[str] = set()
        tools: list[ToolDef] = []
        wanted = per - 1 if i == 0 else per
        while len(tools) < wanted:
            d = defs[k % len(defs)]
            k += 1
            name, n = d.name, 1
            while name in names or name == ADD_TOOL:
                n += 1
                name = f"{d.name}_{n}"
            names.add(name)
            tools.append(ToolDef(name, d.description, d.schema, d.title, d.annotations))
        if i == 0:
            tools.append(ADD_TOOL_DEF)
        out.append(tools)
    return out


def marker(k: int) -> str:
    """A made-up word no tool uses, distinct for each ``k``: the new tool's only match."""
    syllables = ("zu", "ka", "mo", "ri", "pe", "lo", "vu", "ni", "ta", "xe")
    return "qw" + "".join(syllables[int(d)] for d in f"{k:03d}") + "ix"


# -- the upstreams' host (a child process) ------------------------------------------------------


def upstream_server(name: str, tools: Sequence[ToolDef]) -> FastMCP:
    server = FastMCP(name)

    def run() -> str:
        return "ok"

    template = Tool.from_function(run, name="template", description="")
    for d in tools:
        if d.name == ADD_TOOL:
            continue
        annotations = types.ToolAnnotations.model_validate(d.annotations) if d.annotations else None
        update = {
            "name": d.name,
            "title": d.title,
            "description": d.description,
            "parameters": d.schema,
            "output_schema": None,
            "annotations": annotations,
        }
        server.add_tool(template.model_copy(update=update))
    if any(d.name == ADD_TOOL for d in tools):

        async def add_tool(name: str, description: str, ctx: Context) -> str:
            """Register a new tool on this server and announce tools/list_changed to the client."""
            server.add_tool(template.model_copy(update={"name": name, "description": description}))
            await ctx.send_notification(types.ToolListChangedNotification())
            return name

        server.tool(add_tool, name=ADD_TOOL)
    return server


def upstreams_app(catalog: Sequence[Sequence[ToolDef]]) -> Starlette:
    """One app serving upstream ``u{i}`` at ``/u{i}/mcp``."""
    apps = [upstream_server(f"u{i}", tools).http_app(path="/mcp") for i, tools in enumerate(catalog)]
    routes = [Mount(f"/u{i}", app=app) for i, app in enumerate(apps)]
    return Starlette(routes=routes, lifespan=combine_lifespans(*(app.lifespan for app in apps)))


async def host_upstreams(spec: str, tools_json: str) -> None:
    """Child mode: serve the upstreams; print the base URL; stop when stdin closes."""
    size = Size.parse(spec)
    defs, _ = definitions(Path(tools_json) if tools_json else None)
    app = upstreams_app(catalog_of(defs, size.upstreams, size.tools))
    async with serving(app, free_socket(), backlog=4096) as base:
        print(base, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


def definitions(path: Path | None) -> tuple[list[ToolDef], str]:
    """The tool definitions to cycle, and where they came from."""
    if path is not None and path.exists():
        defs = harvested(path)
        return (
            defs,
            f"{len(defs)} harvested tools from {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
        )
    defs = generated()
    return defs, f"{len(defs)} generated tools ({'no ' + str(path) if path else 'asked for'})"


# -- child processes ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``'s live threads (Linux ``schedstat``: nanoseconds, not clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


@dataclass(frozen=True)
class Memory:
    rss_mb: float
    hwm_mb: float
    """The peak resident set (VmHWM)."""


def memory(pid: int) -> Memory:
    """``pid``'s VmRSS and VmHWM in MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return Memory(values["VmRSS"], values["VmHWM"])


@dataclass
class Lines:
    """A child's output line by line, each with the seconds since ``started`` it arrived at."""

    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)
    ended: bool = False

    async def read(self, stream: ByteReceiveStream) -> None:
        buffer = ""
        async for chunk in TextReceiveStream(stream, errors="replace"):
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            at = time.perf_counter() - self.started
            self.lines += [(at, line) for line in complete]
            self._wake()
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, pattern: str) -> tuple[float, re.Match[str]]:
        """The first line matching ``pattern`` (waiting for it) and when it came.

        Raises:
            RuntimeError: the output ended without one.
        """
        while (found := self.first(pattern)) is None:
            if self.ended:
                raise RuntimeError(f"no line matched {pattern!r}; the last lines:\n{self.tail()}")
            await self.changed.wait()
        return found

    def first(self, pattern: str) -> tuple[float, re.Match[str]] | None:
        compiled = re.compile(pattern)
        return next(((at, m) for at, line in self.lines if (m := compiled.search(line))), None)

    def last(self, pattern: str) -> float | None:
        compiled = re.compile(pattern)
        return next((at for at, line in reversed(self.lines) if compiled.search(line)), None)

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


async def stop_process(process: Process, bound: float = STOP_BOUND) -> None:
    """SIGTERM, then SIGKILL after ``bound`` seconds; reaped either way."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
            with anyio.move_on_after(bound):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def upstreams_host(spec: str, tools_json: Path | None) -> AsyncIterator[tuple[str, int]]:
    """The upstreams' host child; yield (base URL, pid)."""
    argv = [sys.executable, str(SCRIPT), "--serve-upstreams", spec]
    argv += ["--tools-json", str(tools_json) if tools_json else ""]
    process = await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
    out = Lines(time.perf_counter())
    assert process.stdout is not None
    assert process.stdin is not None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(out.read, process.stdout)
            with anyio.fail_after(STARTUP_BOUND):
                _, found = await out.wait_for(r"^http://\S+$")
            yield found.group(0), process.pid
            await process.stdin.aclose()  # the child's signal to stop
            with anyio.move_on_after(STOP_BOUND):
                await process.wait()
            tg.cancel_scope.cancel()
    finally:
        await stop_process(process)


@dataclass(frozen=True)
class StartUp:
    """One gateway's start-up, seconds from spawn, read from its log and ``/readyz``."""

    up: float
    """The first log line: imports done, configuration read."""
    connected: float
    """The last upstream connected."""
    index: float | None
    """The tool index built (None: the code before has none)."""
    ready: float
    """``/readyz`` answered 200: every upstream connected, the catalog (and index) built."""
    index_ms: float | None
    """How long building the index took, by the gateway's own log."""
    cpu_s: float
    """The gateway's CPU time until ready."""
    memory: Memory
    """Its RSS once ready (before any client)."""

    def describe(self) -> str:
        index = f" / {self.index:.2f}" if self.index is not None else " / -"
        return f"{self.up:.2f} / {self.connected:.2f}{index} / {self.ready:.2f} (CPU {self.cpu_s:.2f})"


@dataclass(frozen=True)
class GatewayRun:
    label: str
    pid: int
    url: str
    start: StartUp


def free_port() -> int:
    with free_socket() as sock:
        return sock.getsockname()[1]


@asynccontextmanager
async def gateway_process(
    label: str, config: dict[str, Any], workdir: Path, pythonpath: Path | None, wrap: Sequence[str] = ()
) -> AsyncIterator[GatewayRun]:
    """``agent-gateway serve -c <config>`` in a child (``pythonpath``: another checkout's
    ``src`` first; ``wrap``: a command that runs it, e.g. py-spy); yield once ``/readyz``
    answers 200; stop and reap it on exit."""
    port = free_port()
    config = {**config, "server": {**config.get("server", {}), "port": port}}
    path = workdir / f"{re.sub(r'[^a-z0-9]+', '-', label.lower())}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    argv = [
        *wrap,
        str(BIN / "agent-gateway"),
        "serve",
        "-c",
        str(path),
        "--transport",
        "http",
    ]
    started = time.perf_counter()
    process = await anyio.open_process(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=workdir,
        env=env,
    )
    log = Lines(started)
    assert process.stderr is not None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(log.read, process.stderr)
            with anyio.fail_after(STARTUP_BOUND):
                await log.wait_for(r"serving on http://")
                ready = await ready_after(f"http://127.0.0.1:{port}/readyz", started)
            pid = child_of(process.pid) if wrap else process.pid
            yield GatewayRun(label, pid, f"http://127.0.0.1:{port}/mcp", startup(log, ready, pid))
            if pid != process.pid:  # the wrapper ends with it (py-spy then writes its profile)
                os.kill(pid, signal.SIGTERM)
                with anyio.move_on_after(STOP_BOUND):
                    await process.wait()
            await stop_process(process)
            tg.cancel_scope.cancel()
    finally:
        await stop_process(process)


def child_of(pid: int) -> int:
    """The one child process of ``pid``."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"process {pid} has children {children}, not one")
    return int(children[0])


def startup(log: Lines, ready: float, pid: int) -> StartUp:
    index = log.first(r"tool index ready: .* in (\d+) ms")
    return StartUp(
        up=log.lines[0][0],
        connected=log.last(r"\S+ ready: \d+ tools") or 0.0,
        index=index[0] if index else None,
        ready=ready,
        index_ms=float(index[1].group(1)) if index else None,
        cpu_s=cpu_seconds(pid),
        memory=memory(pid),
    )


async def ready_after(url: str, started: float) -> float:
    """Seconds from ``started`` until ``url`` answers 200 (polled: it has no event to wait on)."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            with suppress(httpx.TransportError):
                if (await http.get(url)).status_code == 200:
                    return time.perf_counter() - started
            await anyio.sleep(0.005)


# -- profiles (--profile) -------------------------------------------------------------------


def spy(args: Sequence[str], path: Path) -> list[str]:
    """A py-spy recording (collapsed stacks, 100 Hz, the target not paused) into ``path``."""
    return [
        str(BIN / "py-spy"),
        "record",
        "--rate",
        "100",
        "--nonblocking",
        "--format",
        "raw",
        "-o",
        str(path),
        *args,
    ]


@asynccontextmanager
async def attached(pid: int, path: Path | None) -> AsyncIterator[None]:
    """py-spy records ``pid`` while the body runs (nothing happens without ``path``)."""
    if path is None:
        yield
        return
    process = await anyio.open_process(spy(["--pid", str(pid)], path), stdout=subprocess.PIPE, stderr=None)
    out = Lines(time.perf_counter())
    assert process.stdout is not None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(out.read, process.stdout)
            with anyio.fail_after(STARTUP_BOUND):
                await out.wait_for(r"Sampling process")
            yield
            process.send_signal(signal.SIGINT)  # py-spy writes its profile and exits
            with anyio.move_on_after(STOP_BOUND):
                await process.wait()
            tg.cancel_scope.cancel()
    finally:
        await stop_process(process)


def hot_functions(path: Path, top: int = 12) -> str:
    """The functions most samples of a collapsed-stack profile are in: inclusive and self."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        n = int(count)
        total += n
        own[frames[-1]] += n
        inclusive.update(dict.fromkeys(set(frames), n))
    # Frames on (nearly) every stack are the entry point and the event loop: they say nothing.
    telling = [(name, n) for name, n in inclusive.most_common() if n < 0.9 * total][:top]
    lines = [f"{path.name}: {total} samples (100 Hz; an idle event loop is sampled too)", "  inclusive:"]
    lines += [f"    {n / total:6.1%}  {name}" for name, n in telling]
    lines.append("  self:")
    lines += [f"    {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)


def profile_path(options: Options, size: Size, phase: str) -> Path | None:
    return options.profile / f"{size}-{phase}.txt" if options.profile is not None else None


async def profile_startup(base: str, size: Size, options: Options, workdir: Path) -> None:
    """One more gateway (search.mode off), launched under py-spy and stopped once ready."""
    path = profile_path(options, size, "startup")
    assert path is not None
    progress(f"{size}: start-up under py-spy ...")
    config = gateway_config(base, size, {}, {"mode": "off"})
    async with gateway_process(f"profile {size}", config, workdir, None, spy(["--"], path)):
        pass


# -- through the gateway ------------------------------------------------------------------------


@dataclass
class Notices:
    """Counts ``tools/list_changed`` notifications; ``event`` is set on each."""

    count: int = 0
    event: anyio.Event = field(default_factory=anyio.Event)

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.count += 1
            self.event.set()

    def rearm(self) -> None:
        self.event = anyio.Event()


def new_client(url: str, notices: Notices | None = None) -> Client:
    # Handshake era: its clients are told notifications/tools/list_changed on their session.
    return Client(url, mode="legacy", cache=None, read_timeout_seconds=CALL_TIMEOUT, message_handler=notices)


async def list_all(client: Client) -> tuple[list[float], list[str]]:
    """Every page of ``tools/list`` following ``nextCursor``: each page's seconds, and the names."""
    latencies: list[float] = []
    names: list[str] = []
    cursor: str | None = None
    while True:
        started = time.perf_counter()
        page = await client.list_tools(cursor=cursor)
        latencies.append(time.perf_counter() - started)
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            return latencies, names


@dataclass
class Listed:
    """A gateway's ``tools/list``: the first after start-up (cold) and ``rounds`` more."""

    first: list[float] = field(default_factory=list)
    pages: list[float] = field(default_factory=list)
    """Each page of the warm rounds, seconds."""
    totals: list[float] = field(default_factory=list)
    """Each warm round's whole list, seconds."""
    tools: int = 0
    cpu_s: float = 0.0
    """The gateway's CPU over the warm rounds."""
    raw: list[float] = field(default_factory=list)
    """Each page as served: a bare HTTP POST until its body is read, not parsed."""


async def measure_listing(client: Client, pid: int, url: str, rounds: int, expected: int) -> Listed:
    listed = Listed()
    listed.first, names = await list_all(client)
    catalog = [n for n in names if SEPARATOR in n]
    if len(catalog) != expected or len(set(names)) != len(names):
        raise RuntimeError(f"listed {len(catalog)} catalog tools ({len(names)} in all), expected {expected}")
    listed.tools = len(names)
    cpu = cpu_seconds(pid)
    for _ in range(rounds):
        started = time.perf_counter()
        pages, _ = await list_all(client)
        listed.totals.append(time.perf_counter() - started)
        listed.pages += pages
    listed.cpu_s = cpu_seconds(pid) - cpu
    listed.raw = await raw_pages(url, rounds)
    return listed


_HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


async def raw_pages(url: str, rounds: int) -> list[float]:
    """``tools/list`` page by page over bare HTTP (handshake era): each page's time from the
    POST until its body is read, so the client's own parsing and validation is not counted."""
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT, headers=_HEADERS) as http:
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        }
        answer = await http.post(
            url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        )
        http.headers["mcp-session-id"] = answer.headers["mcp-session-id"]
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        latencies: list[float] = []
        for _ in range(rounds):
            cursor: str | None = None
            while True:
                params = {"cursor": cursor} if cursor else {}
                started = time.perf_counter()
                answer = await http.post(
                    url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params}
                )
                latencies.append(time.perf_counter() - started)
                if (cursor := jsonrpc_result(answer).get("nextCursor")) is None:
                    break
        await http.delete(url)
        return latencies


def jsonrpc_result(answer: httpx.Response) -> dict[str, Any]:
    """The ``result`` of a JSON-RPC answer sent as JSON or as one server-sent event."""
    text = answer.text
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    message = json.loads(text)
    if "result" not in message:
        raise RuntimeError(f"tools/list failed: {text[:300]}")
    return message["result"]


@dataclass
class Changes:
    """One upstream's change, seconds from calling ``add_tool`` to each observation."""

    told: list[float] = field(default_factory=list)
    listed: list[float] = field(default_factory=list)
    found: list[float] = field(default_factory=list)
    polls: list[int] = field(default_factory=list)
    """``search_tools`` calls until the new tool was found."""


async def change_listed(client: Client, notices: Notices, k: int, out: Changes) -> None:
    """Add a tool to ``u0`` through the gateway; time until this client is told, then listed."""
    name = f"reticulate_{marker(k)}"
    notices.rearm()
    started = time.perf_counter()
    await client.call_tool(
        f"{CHANGING}{SEPARATOR}{ADD_TOOL}", {"name": name, "description": f"Reticulate {marker(k)}."}
    )
    with anyio.fail_after(CHANGE_BOUND):
        await notices.event.wait()
    out.told.append(time.perf_counter() - started)
    _, names = await list_all(client)
    out.listed.append(time.perf_counter() - started)
    if f"{CHANGING}{SEPARATOR}{name}" not in names:
        raise RuntimeError(f"{name} was announced but not listed")


async def change_found(client: Client, k: int, out: Changes) -> None:
    """Add a tool to ``u0`` (through ``call_tool``); time until ``search_tools`` finds it."""
    name = f"reticulate_{marker(k)}"
    public = f"{CHANGING}{SEPARATOR}{name}"
    started = time.perf_counter()
    arguments = {"name": name, "description": f"Reticulate {marker(k)}."}
    await client.call_tool(CALL_TOOL, {"name": f"{CHANGING}{SEPARATOR}{ADD_TOOL}", "arguments": arguments})
    polls = 0
    with anyio.fail_after(CHANGE_BOUND):
        while True:  # found by searching: a client in search mode is told nothing of it
            polls += 1
            if public in found_names(await client.call_tool(SEARCH_TOOLS, {"query": marker(k)})):
                break
    out.found.append(time.perf_counter() - started)
    out.polls.append(polls)


def found_names(result: types.CallToolResult) -> list[str]:
    if result.is_error or not isinstance(result.structured_content, dict):
        raise RuntimeError(f"search_tools failed: {result.content}")
    return [t["name"] for t in result.structured_content["tools"]]


async def pings(client: Client, count: int) -> list[float]:
    """``ping`` round trips: what any request through the gateway costs this client at least."""
    latencies: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        with warnings.catch_warnings():  # ping is gone from the modern era; these clients are handshake-era
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.send_ping()
        latencies.append(time.perf_counter() - started)
    return latencies


@dataclass
class Searched:
    latencies: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    empty: int = 0
    """Queries that found nothing."""
    pings: list[float] = field(default_factory=list)


async def measure_search(client: Client, pid: int, queries: Sequence[str]) -> Searched:
    await client.list_tools()  # learn search_tools' output schema (the client checks results against it)
    for q in queries[:10]:
        await client.call_tool(SEARCH_TOOLS, {"query": q})
    out = Searched()
    cpu = cpu_seconds(pid)
    for q in queries:
        started = time.perf_counter()
        result = await client.call_tool(SEARCH_TOOLS, {"query": q})
        out.latencies.append(time.perf_counter() - started)
        out.empty += not found_names(result)
    out.cpu_s = cpu_seconds(pid) - cpu
    out.pings = await pings(client, 100)
    return out


# -- in this process ----------------------------------------------------------------------------


@dataclass
class InProcess:
    catalog_ms: list[float] = field(default_factory=list)
    """CPU of ``Catalog.update`` up to its listeners: the upstream's part rebuilt, parts merged."""
    index_ms: list[float] = field(default_factory=list)
    """CPU of ``ToolSearch.changed``: the upstream's rows replaced in the index."""
    total_ms: list[float] = field(default_factory=list)
    """CPU of the whole ``Catalog.update`` (with the index's and the listing's listeners)."""
    view_ms: list[float] = field(default_factory=list)
    """CPU of the next ``tools/list`` view of the changed catalog (paid by the first listing after)."""
    build_ms: float = 0.0
    load_ms: float = 0.0
    search: list[float] = field(default_factory=list)
    """``ToolSearch.search``, seconds each (wall)."""
    search_cpu: list[float] = field(default_factory=list)
    """``ToolSearch.search``, seconds each (this thread's CPU)."""
    search_cold: list[float] = field(default_factory=list)
    """``ToolSearch.search`` with no term's scores kept (as after a catalog change), seconds each."""


async def in_process(catalog: Sequence[Sequence[ToolDef]], queries: Sequence[str], repeats: int) -> InProcess:
    """Catalog, ToolSearch and ToolListing without a Gateway, fed Listings of ``catalog``."""
    names = [f"u{i}" for i in range(len(catalog))]
    config = parse_config(
        {"upstreams": {n: {"url": "http://127.0.0.1:9/mcp"} for n in names}, "search": {"mode": "off"}},
        {},
        source="catalog-scale",
    )
    listings = [Listing(tools=tuple(d.mcp() for d in tools)) for tools in catalog]
    out = InProcess()
    store = Catalog(config, own_tool_names(config))
    cpu = time.thread_time()
    for name, listing in zip(names, listings, strict=True):
        await store.update(name, listing)
    snapshot = store.start()
    out.build_ms = (time.thread_time() - cpu) * 1e3
    search = ToolSearch()
    cpu = time.thread_time()
    await search.load(snapshot)
    out.load_ms = (time.thread_time() - cpu) * 1e3
    listing = ToolListing(store, config.search, config.server.page_size, lambda *_: [])
    stamps: list[float] = []

    async def stamp(_: CatalogChange) -> None:
        stamps.append(time.thread_time())

    for listener in (stamp, search.changed, stamp, listing.changed):
        store.subscribe(listener)
    listing.view(snapshot, None)
    base = listings[0].tools
    for r in range(repeats):
        extra = ADD_TOOL_DEF.mcp(f"extra_{r}")
        stamps.clear()
        cpu = time.thread_time()
        await store.update(names[0], Listing(tools=(*base, extra)))
        done = time.thread_time()
        listing.view(store.snapshot, None)
        out.view_ms.append((time.thread_time() - done) * 1e3)
        out.catalog_ms.append((stamps[0] - cpu) * 1e3)
        out.index_ms.append((stamps[1] - stamps[0]) * 1e3)
        out.total_ms.append((done - cpu) * 1e3)
    for q in queries[:10]:  # warm, as the gateway is when measured
        await search.search(store.snapshot, q, config.search.limit)
    for q in queries:
        started, cpu = time.perf_counter(), time.thread_time()
        await search.search(store.snapshot, q, config.search.limit)
        out.search.append(time.perf_counter() - started)
        out.search_cpu.append(time.thread_time() - cpu)
    for q in queries:
        # Cold: no term's scores kept, as after any catalog change (the index's private cache).
        search._index._forget_postings()  # pyright: ignore[reportPrivateUsage]
        started = time.perf_counter()
        await search.search(store.snapshot, q, config.search.limit)
        out.search_cold.append(time.perf_counter() - started)
    return out


async def fastmcp_search(
    catalog: Sequence[Sequence[ToolDef]], queries: Sequence[str]
) -> tuple[float, list[float]]:
    """FastMCP's ``BM25SearchTransform`` over the same tools (public names): seconds of its first
    search (which builds its index) and of each of ``queries``."""
    server = FastMCP("fastmcp-bm25")

    def run() -> str:
        return "ok"

    template = Tool.from_function(run, name="template", description="")
    for i, tools in enumerate(catalog):
        for d in tools:
            name = public_name(f"u{i}", d.name, prefix=True, separator=SEPARATOR)
            update = {"name": name, "title": d.title, "description": d.description, "parameters": d.schema}
            server.add_tool(template.model_copy(update={**update, "output_schema": None}))
    server.add_transform(BM25SearchTransform(max_results=10))
    latencies: list[float] = []
    async with FastMCPClient(server, timeout=CALL_TIMEOUT) as client:
        started = time.perf_counter()
        await client.call_tool("search_tools", {"query": queries[0]})
        first = time.perf_counter() - started
        for q in queries:
            started = time.perf_counter()
            await client.call_tool("search_tools", {"query": q})
            latencies.append(time.perf_counter() - started)
    return first, latencies


# -- one size -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    upstreams: int
    tools: int

    @classmethod
    def parse(cls, text: str) -> Size:
        upstreams, _, tools = text.lower().partition("x")
        return cls(int(upstreams), int(tools))

    @property
    def total(self) -> int:
        return self.upstreams * self.tools

    def __str__(self) -> str:
        return f"{self.upstreams}x{self.tools}"


@dataclass(frozen=True)
class Options:
    sizes: tuple[Size, ...]
    page_sizes: tuple[int, ...]
    """The first is the main run's."""
    rounds: int
    queries: tuple[str, ...]
    changes: int
    repeats: int
    fastmcp_queries: int
    before: Path | None
    before_ref: str
    tools_json: Path | None
    profile: Path | None
    """A directory for py-spy profiles of the gateway (start-up, listing, searches)."""


@dataclass
class Before:
    run: GatewayRun
    listed: Listed
    memory: Memory


@dataclass
class SizeReport:
    size: Size
    before: Before | None = None
    listings: dict[int, tuple[GatewayRun, Listed]] = field(default_factory=dict)
    listed_changes: Changes = field(default_factory=Changes)
    off_memory: Memory | None = None
    search_run: GatewayRun | None = None
    searched: Searched = field(default_factory=Searched)
    found_changes: Changes = field(default_factory=Changes)
    search_memory: Memory | None = None
    upstream_cpu_s: float = 0.0
    inproc: InProcess = field(default_factory=InProcess)
    fastmcp_first: float = 0.0
    fastmcp: list[float] = field(default_factory=list)

    @property
    def peak_mb(self) -> float:
        return max(m.hwm_mb for m in (self.off_memory, self.search_memory) if m is not None)


def gateway_config(
    base: str, size: Size, server: dict[str, Any], search: dict[str, Any] | None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "server": server,
        "upstreams": {f"u{i}": {"url": f"{base}/u{i}/mcp"} for i in range(size.upstreams)},
    }
    if search is not None:
        config["search"] = search
    return config


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run_before(base: str, size: Size, options: Options, workdir: Path, report: SizeReport) -> None:
    assert options.before is not None
    progress(f"{size}: the code before ({options.before_ref}) ...")
    # A "before" that has tool search lists in full only with it off, as ours is measured.
    has_search = (options.before / "src" / "agent_gateway" / "search").is_dir()
    config = gateway_config(base, size, {}, {"mode": "off"} if has_search else None)
    async with (
        gateway_process(f"before {size}", config, workdir, options.before / "src") as run,
        new_client(run.url) as client,
    ):
        with anyio.fail_after(MEASURE_BOUND):
            listed = await measure_listing(client, run.pid, run.url, options.rounds, size.total)
        report.before = Before(run, listed, memory(run.pid))


async def run_listing(
    base: str, size: Size, page: int, options: Options, workdir: Path, report: SizeReport
) -> None:
    """search.mode off with ``page``; the main run (the first page size) also changes ``u0``."""
    main = page == options.page_sizes[0]
    progress(f"{size}: search.mode off, page_size {page} ...")
    config = gateway_config(base, size, {"page_size": page}, {"mode": "off"})
    notices = Notices()
    async with (
        gateway_process(f"off {size} page {page}", config, workdir, None) as run,
        new_client(run.url, notices) as client,
    ):
        with anyio.fail_after(MEASURE_BOUND):
            async with attached(run.pid, profile_path(options, size, f"list-{page}") if main else None):
                listed = await measure_listing(client, run.pid, run.url, options.rounds, size.total)
            report.listings[page] = (run, listed)
        if main:
            with anyio.fail_after(MEASURE_BOUND):
                for k in range(options.changes):
                    await change_listed(client, notices, k, report.listed_changes)
            report.off_memory = memory(run.pid)


async def run_search(base: str, size: Size, options: Options, workdir: Path, report: SizeReport) -> None:
    progress(f"{size}: search.mode on ...")
    config = gateway_config(base, size, {}, {"mode": "on"})
    async with (
        gateway_process(f"on {size}", config, workdir, None) as run,
        new_client(run.url) as client,
    ):
        report.search_run = run
        with anyio.fail_after(MEASURE_BOUND):
            async with attached(run.pid, profile_path(options, size, "search")):
                report.searched = await measure_search(client, run.pid, options.queries)
        with anyio.fail_after(MEASURE_BOUND):
            for k in range(options.changes):  # markers after the search.mode off run's
                await change_found(client, options.changes + k, report.found_changes)
        report.search_memory = memory(run.pid)


async def measure_size(size: Size, options: Options, defs: Sequence[ToolDef]) -> SizeReport:
    report = SizeReport(size)
    with tempfile.TemporaryDirectory(prefix="catalog-scale-") as tmp:
        workdir = Path(tmp)
        async with upstreams_host(str(size), options.tools_json) as (base, upstream_pid):
            cpu = cpu_seconds(upstream_pid)
            if options.before is not None:
                await run_before(base, size, options, workdir, report)
            for page in (*options.page_sizes[1:], options.page_sizes[0]):  # the main run last: it changes u0
                await run_listing(base, size, page, options, workdir, report)
            await run_search(base, size, options, workdir, report)
            report.upstream_cpu_s = cpu_seconds(upstream_pid) - cpu
            if options.profile is not None:
                await profile_startup(base, size, options, workdir)
    progress(f"{size}: in process (Catalog, ToolSearch, FastMCP's BM25SearchTransform) ...")
    catalog = catalog_of(defs, size.upstreams, size.tools)
    report.inproc = await in_process(catalog, options.queries, options.repeats)
    report.fastmcp_first, report.fastmcp = await fastmcp_search(
        catalog, options.queries[: options.fastmcp_queries]
    )
    return report


# -- reporting ------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def spread(values: Sequence[float]) -> str:
    """p50 / p99 / max in ms of ``values`` in seconds."""
    return f"{ms(pct(values, 50))} / {ms(pct(values, 99))} / {ms(max(values))}" if values else "-"


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


@dataclass(frozen=True)
class Row:
    measure: str
    ours: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    met: str = ""

    def render(self) -> str:
        return (
            f"| {self.measure} | {self.ours} | {self.baseline} | {self.ratio} | {self.target} | {self.met} |"
        )


def target(ok: bool, text: str, applies: bool = True) -> dict[str, str]:
    """The ``target`` and ``met`` cells of a row (empty where the target is not for this size)."""
    return {"target": text, "met": "yes" if ok else "**no**"} if applies else {}


def startup_rows(r: SizeReport, main: int) -> list[Row]:
    run, listed = r.listings[main]
    up = run.start.ready + sum(listed.first)
    at_10k = r.size.total >= 10_000
    ready = run.start.ready
    rows = [
        Row(
            "start-up: process up / upstreams connected / index / ready, s from spawn (ready < 5)",
            run.start.describe(),
            **target(ready < 5, "ready < 5", at_10k),
        ),
        Row("start-up to ready + a client's first whole tools/list, s", f"{up:.2f}"),
    ]
    if r.before is not None:
        b = r.before
        b_up = b.run.start.ready + sum(b.listed.first)
        rows[0] = replace(
            rows[0], baseline=b.run.start.describe(), ratio=ratio(run.start.ready, b.run.start.ready)
        )
        rows[1] = replace(rows[1], baseline=f"{b_up:.2f}", ratio=ratio(up, b_up))
    rows.append(Row("tool index built (the gateway's log), ms", f"{run.start.index_ms or 0:,.0f}"))
    others = [f"page {p}: {g.start.ready:.2f}" for p, (g, _) in sorted(r.listings.items()) if p != main]
    if r.search_run is not None:
        others.append(f"search.mode on: {r.search_run.start.ready:.2f}")
    rows.append(Row("(ready, the other runs of this size, s)", ", ".join(others)))
    return rows


def listing_rows(r: SizeReport, main: int) -> list[Row]:
    rows: list[Row] = []
    for page, (_, listed) in sorted(r.listings.items(), key=lambda item: item[0] != main):
        worst = max(listed.pages + listed.first)
        rows += [
            Row(
                f"tools/list page of {page} ({len(listed.first)} pages), p50 / p99 / max ms",
                spread(listed.pages),
                **target(worst < 0.020, "< 20 each"),
            ),
            Row(
                f"  page {page} served: bare HTTP POST to body read, p50 / p99 / max ms",
                spread(listed.raw),
                **target(max(listed.raw) < 0.020, "< 20 each"),
            ),
            Row(f"  page {page}: the first page after start-up (cold), ms", ms(listed.first[0])),
            Row(f"  page {page}: gateway CPU per page, ms", f"{listed.cpu_s * 1e3 / len(listed.pages):.2f}"),
        ]
    listed = r.listings[main][1]
    whole = Row(
        f"whole tools/list, page {main}, median of {len(listed.totals)}, ms",
        ms(statistics.median(listed.totals)),
    )
    cold = Row(f"whole tools/list, page {main}, the first after start-up, ms", ms(sum(listed.first)))
    if r.before is not None:
        b = r.before.listed
        whole = replace(
            whole,
            baseline=ms(statistics.median(b.totals)),
            ratio=ratio(statistics.median(listed.totals), statistics.median(b.totals)),
        )
        cold = replace(cold, baseline=ms(sum(b.first)), ratio=ratio(sum(listed.first), sum(b.first)))
    return [
        *rows,
        whole,
        cold,
        Row("(ping round trip, the floor of any request, p50 / p99 / max ms)", spread(r.searched.pings)),
    ]


def change_rows(r: SizeReport) -> list[Row]:
    i = r.inproc
    total = statistics.median(i.total_ms)
    return [
        Row(
            f"one upstream's change in process: Catalog.update with the index, CPU ms (median of {len(i.total_ms)})",
            f"{total:.1f}",
            **target(total < 50, "< 50", r.size.total >= 10_000),
        ),
        Row(
            "  of which: the upstream's part rebuilt and the parts merged, ms",
            f"{statistics.median(i.catalog_ms):.1f}",
        ),
        Row(
            "  of which: the index's rows for the upstream replaced, ms",
            f"{statistics.median(i.index_ms):.1f}",
        ),
        Row("  then: the next tools/list view built, ms", f"{statistics.median(i.view_ms):.1f}"),
        Row(
            "through the gateway: add_tool called to the client told, p50 / max ms",
            pair(r.listed_changes.told),
        ),
        Row(
            "  to the new tool listed (the whole list read again), p50 / max ms",
            pair(r.listed_changes.listed),
        ),
        Row(
            "  to the new tool found by search_tools (search.mode on), p50 / max ms",
            pair(r.found_changes.found),
        ),
    ]


def pair(values: Sequence[float]) -> str:
    return f"{ms(pct(values, 50))} / {ms(max(values))}" if values else "-"


def search_rows(r: SizeReport) -> list[Row]:
    bound = 0.005 if r.size.total <= 3_000 else 0.015
    ours, engine, theirs = r.searched.latencies, r.inproc.search, r.fastmcp
    p50 = pct(ours, 50)
    return [
        Row(
            f"search_tools through the gateway, p50 / p99 / max ms ({len(ours)} queries)",
            spread(ours),
            spread(theirs),
            ratio(p50, pct(theirs, 50)),
            **target(p50 < bound, f"p50 < {bound * 1e3:.0f}"),
        ),
        Row("  gateway CPU per search_tools, ms", f"{r.searched.cpu_s * 1e3 / len(ours):.2f}"),
        Row(
            f"search engine alone, ToolSearch.search, p50 / p99 / max ms ({len(engine)} queries)",
            spread(engine),
            spread(theirs),
            ratio(pct(engine, 50), pct(theirs, 50)),
        ),
        Row("  the same, CPU p50 / p99 / max ms", spread(r.inproc.search_cpu)),
        Row(
            "  the same, cold (no term's scores kept, as after a change), p50 / p99 / max ms",
            spread(r.inproc.search_cold),
        ),
        Row(
            "(FastMCP BM25SearchTransform: its first search, which builds its index, ms)",
            "",
            ms(r.fastmcp_first),
        ),
    ]


def memory_rows(r: SizeReport, main: int) -> list[Row]:
    ready = r.listings[main][0].start.memory
    rows = [Row("gateway RSS once ready, before any client, MiB (search.mode off)", f"{ready.rss_mb:,.0f}")]
    if r.before is not None:
        b = r.before.run.start.memory
        rows[0] = replace(rows[0], baseline=f"{b.rss_mb:,.0f}", ratio=ratio(ready.rss_mb, b.rss_mb))
    for label, mem in (
        ("search.mode off, after listing and changes", r.off_memory),
        ("search.mode on, after searches", r.search_memory),
    ):
        if mem is None:
            continue
        row = Row(
            f"gateway RSS / peak, MiB ({label})",
            f"{mem.rss_mb:,.0f} / {mem.hwm_mb:,.0f}",
            **target(mem.hwm_mb < 400, "peak < 400", r.size.total >= 10_000),
        )
        if r.before is not None:
            b = r.before.memory
            row = replace(
                row, baseline=f"{b.rss_mb:,.0f} / {b.hwm_mb:,.0f}", ratio=ratio(mem.hwm_mb, b.hwm_mb)
            )
        rows.append(row)
    rows += [
        Row(
            "in process: catalog built / index loaded from nothing, CPU ms",
            f"{r.inproc.build_ms:,.0f} / {r.inproc.load_ms:,.0f}",
        ),
        Row("(the upstreams' host process, CPU over this size's runs, s)", f"{r.upstream_cpu_s:.1f}"),
    ]
    return rows


def size_table(r: SizeReport, main: int, before_ref: str) -> str:
    rows = (
        startup_rows(r, main) + listing_rows(r, main) + change_rows(r) + search_rows(r) + memory_rows(r, main)
    )
    return "\n".join(
        [
            f"### {r.size.total:,} tools ({r.size.upstreams} upstreams x {r.size.tools} tools)",
            "",
            f"| measure | agent-gateway | baseline: before ({before_ref}); search: FastMCP BM25 | ratio | target | met |",
            "|---|---:|---:|---:|---|---|",
            *(row.render() for row in rows),
        ]
    )


def summary(reports: Sequence[SizeReport], main: int) -> str:
    lines = [
        "### Summary: the issue's targets",
        "",
        "| target | " + " | ".join(f"{r.size.total:,}" for r in reports) + " |",
        "|---|" + "---:|" * len(reports),
    ]

    def row(label: str, cell: Callable[[SizeReport], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in reports) + " |")

    row(
        "ready: every upstream connected and listed, s (< 5 at 10,000)",
        lambda r: f"{r.listings[main][0].start.ready:.2f}",
    )
    row(
        "ready + a client's first whole tools/list, s",
        lambda r: f"{r.listings[main][0].start.ready + sum(r.listings[main][1].first):.2f}",
    )
    row(
        "slowest tools/list page, any page size, cold included, ms (< 20)",
        lambda r: ms(max(max(g.pages + g.first) for _, g in r.listings.values())),
    )
    row(f"tools/list page of {main}, warm p99, ms (< 20)", lambda r: ms(pct(r.listings[main][1].pages, 99)))
    row(
        "one upstream's change, Catalog.update with the index, CPU ms (< 50 at 10,000)",
        lambda r: f"{statistics.median(r.inproc.total_ms):.1f}",
    )
    row("search_tools p50, ms (< 5 at 3,000; < 15 at 10,000)", lambda r: ms(pct(r.searched.latencies, 50)))
    row("gateway peak RSS, MiB (< 400 at 10,000)", lambda r: f"{r.peak_mb:,.0f}")
    row("FastMCP BM25 search p50 / ours", lambda r: ratio(pct(r.fastmcp, 50), pct(r.searched.latencies, 50)))
    row("before: whole tools/list (warm) / ours", lambda r: before_ratio(r, main, "list"))
    row("before: ready / ours", lambda r: before_ratio(r, main, "ready"))
    row("before: peak RSS / ours (search.mode off)", lambda r: before_ratio(r, main, "rss"))
    return "\n".join(lines)


def before_ratio(r: SizeReport, main: int, what: str) -> str:
    run, listed = r.listings[main]
    if r.before is None or r.off_memory is None:
        return "-"
    b = r.before
    if what == "list":
        return ratio(statistics.median(b.listed.totals), statistics.median(listed.totals))
    if what == "ready":
        return ratio(b.run.start.ready, run.start.ready)
    return ratio(b.memory.hwm_mb, r.off_memory.hwm_mb)


# -- entry point ----------------------------------------------------------------------------


def before_tree(path: Path, ref: str) -> Path:
    """The worktree of the code before the change, made if absent; its ``src`` must be clean."""
    git = ["git", "-C"]
    if not path.exists():
        subprocess.run([*git, str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True)
    head = subprocess.run([*git, str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    want = subprocess.run([*git, str(ROOT), "rev-parse", ref], capture_output=True, text=True, check=True)
    if head.stdout != want.stdout:
        raise SystemExit(f"{path} is at {head.stdout.strip()}, not {ref}")
    dirty = subprocess.run(
        [*git, str(path), "status", "--porcelain", "--", "src"], capture_output=True, text=True
    )
    if dirty.stdout.strip():
        raise SystemExit(f"{path}/src has local changes:\n{dirty.stdout}")
    return path


async def run(options: Options) -> tuple[list[SizeReport], str]:
    defs, source = definitions(options.tools_json)
    reports = [await measure_size(size, options, defs) for size in options.sizes]
    return reports, source


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add = parser.add_argument
    add("--sizes", default="10x100,30x100,100x100", help="upstreams x tools each, comma-separated")
    add("--page-sizes", default="100,500,1000", help="server.page_size values; the first is the main run's")
    add("--rounds", type=int, default=5, help="whole tools/list rounds after the first (default 5)")
    add("--queries", type=int, default=200, help="search_tools calls (default 200)")
    add("--changes", type=int, default=5, help="changes of u0 per gateway run (default 5)")
    add("--repeats", type=int, default=20, help="in-process changes of one upstream (default 20)")
    add("--fastmcp-queries", type=int, default=30, help="FastMCP BM25 searches (default 30; ~0.1-1 s each)")
    add("--before", default="/tmp/before", help="a worktree of the code before (made if absent)")
    add("--before-ref", default="e5088f6")
    add("--no-before", action="store_true", help="skip the code before")
    add("--tools-json", default=str(TOOLS_JSON), help="harvested tool definitions ('': generate them)")
    add("--profile", help="a directory: record the gateway with py-spy (start-up, listing, searches)")
    add("--serve-upstreams", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def options_of(args: argparse.Namespace) -> Options:
    return Options(
        sizes=tuple(Size.parse(s) for s in args.sizes.split(",")),
        page_sizes=tuple(int(p) for p in args.page_sizes.split(",")),
        rounds=args.rounds,
        queries=tuple(QUERIES[i % len(QUERIES)] for i in range(args.queries)),
        changes=args.changes,
        repeats=args.repeats,
        fastmcp_queries=args.fastmcp_queries,
        before=None if args.no_before else before_tree(Path(args.before), args.before_ref),
        before_ref=args.before_ref,
        tools_json=Path(args.tools_json) if args.tools_json else None,
        profile=Path(args.profile).resolve() if args.profile else None,
    )


def main() -> None:
    args = parse_args()
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.serve_upstreams:
        anyio.run(host_upstreams, args.serve_upstreams, args.tools_json)
        return
    options = options_of(args)
    if options.profile is not None:
        options.profile.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    reports, source = anyio.run(run, options)
    main_page = options.page_sizes[0]
    for report in reports:
        print(size_table(report, main_page, options.before_ref))
        print()
    print(summary(reports, main_page))
    print()
    if options.profile is not None:
        print("```")
        print("\n\n".join(hot_functions(path) for path in sorted(options.profile.glob("*.txt"))))
        print("```")
        print()
    print(f"command: `{shlex.join(sys.orig_argv)}`")
    print(
        f"tools: {source}, cycled; u0 offers add_tool. Upstreams: FastMCP Streamable-HTTP apps in one "
        "child process. The gateway: `agent-gateway serve` in a child, defaults but server.port, "
        "server.page_size and search.mode. Clients: mcp.Client, handshake era, no response cache. "
        f"search_tools: {len(options.queries)} queries cycled from {len(QUERIES)} requests (10 more first, "
        f"to warm up); FastMCP's BM25SearchTransform (max_results 10) on the first {options.fastmcp_queries}, "
        f"in process. Load average (1 min) at the start / end: {load:.1f} / {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs."
    )


if __name__ == "__main__":
    main()
