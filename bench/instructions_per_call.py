"""Instructions per ``tools/call``, counted by valgrind: an A/B the machine's load cannot move.

``cpu_per_call.py`` measures CPU time, and on a shared 2-core machine the same code measures
up to 13 % apart from one pair of runs to the next (``bench/README.md``). Here the process
under test runs under valgrind's callgrind, which counts the instructions it executes; over
the same calls that count repeats within about 0.1 %, whatever else the machine runs. It is
not time: cache misses, the kernel's work for system calls and waits are not in it, and the
process runs ~50 times slower (start-up takes a minute or two). It says which of two versions
of the code does less work per call, and by how much.

Roles (``--role``), each in a process of its own as ``overhead.py`` runs them:

- ``gateway``: ``agent-gateway serve`` on a config with one upstream (audit on, as by default);
- ``relay``: ``bench/relay.py``, a process that only copies bytes: the floor of a hop;
- ``upstream``: the FastMCP echo server itself, called directly: what a plain Python MCP
  server spends on the same call.

The upstream of the gateway and of the relay runs in this process. ``--warmup`` calls are
made first, then the counters are zeroed and ``--calls`` calls counted (one client, one call
at a time: under valgrind a call takes ~50 ms, and several at once would cross the
gateway's 0.25 s threshold for watching a call, which a real client never does). What is
batched by time is batched less: the audit writer gathers the records of 50 ms, a handful of
calls at full speed and one under valgrind, so its share per call is overstated here.

    .venv/bin/python bench/instructions_per_call.py --mode auto            # or legacy
    .venv/bin/python bench/instructions_per_call.py --role relay --role upstream
    .venv/bin/python bench/instructions_per_call.py --against /tmp/wt-X/src  # that code, then this
    .venv/bin/python bench/instructions_per_call.py --extra '{"audit": {"enabled": false}}'

Needs valgrind (Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import Process
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: make `bench` importable
from bench import overhead
from bench.catalog_scale import stop_process
from bench.relay import relay
from tests.support import free_socket

STARTUP_BOUND = 600.0
"""Seconds a process under valgrind may take to serve (imports run ~50 times slower)."""
CALL_TIMEOUT = 120.0
CONTROL_BOUND = 60.0
"""Seconds callgrind_control may take to zero or dump the counters, and the process to stop
(valgrind writes its last dump on the way out)."""
ROLES = ("gateway", "relay", "upstream")


@dataclass(frozen=True)
class Count:
    code: str
    role: str
    mode: str
    calls: int
    instructions: int

    @property
    def per_call(self) -> float:
        return self.instructions / self.calls


# -- the process under valgrind ---------------------------------------------------------------------


def _command(role: str, upstream: str, workdir: Path, port: int, extra: dict[str, Any]) -> list[str]:
    """The command serving ``role`` under callgrind (the gateway on ``port``, ``extra`` merged
    into its config)."""
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir / 'callgrind.out'}"]
    if role == "gateway":
        config: dict[str, Any] = {
            "server": {"port": port},
            "upstreams": {"up": {"url": upstream}},
            "audit": {"path": str(workdir / "audit.jsonl")},
            "agent": {"memory": {"path": str(workdir / "conversations.sqlite")}},
        }
        path = workdir / "gateway.json"
        path.write_text(json.dumps(_merged(config, extra)))
        entry = Path(sys.executable).parent / "agent-gateway"
        return [*valgrind, sys.executable, str(entry), "serve", "-c", str(path)]
    return [*valgrind, sys.executable, __file__, "--serve", role, "--upstream", upstream]


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _free_port() -> int:
    with free_socket() as sock:
        return int(sock.getsockname()[1])


@asynccontextmanager
async def under_valgrind(
    role: str, src: str | None, upstream: str, extra: dict[str, Any]
) -> AsyncIterator[tuple[Process, str, Path]]:
    """``role`` served under callgrind; yields the process, the URL to call, its directory."""
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as home:
        workdir = Path(home)
        env = os.environ | ({"PYTHONPATH": src} if src else {})
        port = _free_port()
        command = _command(role, upstream, workdir, port, extra)
        stdout = subprocess.PIPE if role != "gateway" else subprocess.DEVNULL  # a role prints its URL
        with (workdir / "stderr").open("wb") as errors:
            process = await anyio.open_process(command, env=env, cwd=workdir, stdout=stdout, stderr=errors)
            try:
                with anyio.fail_after(STARTUP_BOUND):
                    url = await _serving_url(role, process, port)
                yield process, url, workdir
            except BaseException:
                errors.flush()
                print((workdir / "stderr").read_text(errors="replace")[-3000:], file=sys.stderr)
                raise
            finally:
                await stop_process(process, CONTROL_BOUND)  # shielded; valgrind writes its dump


async def _serving_url(role: str, process: Process, port: int) -> str:
    if role != "gateway":
        assert process.stdout is not None
        line = b""
        async for chunk in process.stdout:  # the role prints its URL once it serves
            line += chunk
            if b"\n" in line:
                return line.decode().split("\n", 1)[0].strip()
        raise RuntimeError(f"{role} ended before it served")
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base) as http:
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"the gateway exited ({process.returncode}) before it was ready")
            with suppress(httpx.TransportError):
                if (await http.get("/readyz")).status_code == 200:
                    return f"{base}/mcp"
            await anyio.sleep(1)


async def _callgrind(*args: str) -> None:
    # Not a blocking subprocess.run: the other count's gateway and upstream share this loop.
    with anyio.fail_after(CONTROL_BOUND):
        await anyio.run_process(["callgrind_control", *args], check=True)


def _dumped(workdir: Path, keep: Path | None) -> int:
    """The instructions of the dump ``callgrind_control --dump`` wrote (its ``summary:`` line);
    the dump is copied into ``keep`` if given (for ``callgrind_annotate``)."""
    (dump,) = [p for p in workdir.glob("callgrind.out.*") if p.suffix != ".out"]
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(dump, keep / f"callgrind.{workdir.name}.out")
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no summary line")


async def count(
    role: str, mode: str, calls: int, warmup: int, src: str | None, extra: dict[str, Any], keep: Path | None
) -> Count:
    """The instructions ``role`` executes over ``calls`` calls, after ``warmup`` uncounted ones."""
    async with (
        _upstream_for(role) as upstream,
        under_valgrind(role, src, upstream, extra) as (process, url, workdir),
    ):
        tool = "up__echo" if role == "gateway" else "echo"
        async with Client(url, mode=mode, read_timeout_seconds=CALL_TIMEOUT) as client:
            for _ in range(warmup):
                await client.call_tool(tool, {"text": "x"})
            await _callgrind("--zero", str(process.pid))
            for _ in range(calls):
                await client.call_tool(tool, {"text": "x"})
            await _callgrind("--dump", str(process.pid))
        return Count(_revision(src), role, mode, calls, _dumped(workdir, keep))


@asynccontextmanager
async def _upstream_for(role: str) -> AsyncIterator[str]:
    """The upstream the gateway or the relay forwards to, in this process (none for ``upstream``)."""
    if role == "upstream":
        yield ""
        return
    async with overhead.upstream_server() as upstream:
        yield upstream


def _revision(src: str | None) -> str:
    # Without --against the code is what the process imports: PYTHONPATH's first entry wins.
    where = (
        src
        or os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
        or str(Path(__file__).resolve().parent.parent / "src")
    )
    command = ["git", "-C", where, "rev-parse", "--short", "HEAD"]
    head = subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip() or "?"
    dirty = subprocess.run(
        ["git", "-C", where, "status", "--porcelain", "--", "."], capture_output=True, text=True
    )
    return head + ("+changes" if dirty.stdout.strip() else "")


# -- a role served in the foreground (the command valgrind runs) -------------------------------------


async def serve(role: str, upstream: str) -> None:
    """Serve ``role``, print its URL, and serve until terminated."""
    server = relay(upstream) if role == "relay" else overhead.upstream_server()
    async with server as url:
        print(url, flush=True)
        await anyio.sleep_forever()


# -- the run ------------------------------------------------------------------------------------------


def table(counts: Sequence[Count]) -> str:
    first = counts[0].per_call
    lines = [
        "| code | role | era | calls counted | instructions per call | vs the first row |",
        "|---|---|---|---:|---:|---:|",
    ]
    for c in counts:
        ratio = f"{c.per_call / first - 1:+.1%}" if c is not counts[0] else ""
        lines.append(f"| {c.code} | {c.role} | {c.mode} | {c.calls} | {c.per_call / 1e6:.3f} M | {ratio} |")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> list[Count]:
    """Every (code, role) asked for, two at a time: counts do not depend on what else runs."""
    plan = [(src, role) for src in ([args.against, None] if args.against else [None]) for role in args.role]
    counts: dict[int, Count] = {}

    async def one(i: int, src: str | None, role: str, limit: anyio.CapacityLimiter) -> None:
        async with limit:
            counts[i] = await count(
                role, args.mode, args.calls, args.warmup, src, json.loads(args.extra), args.keep
            )

    limit = anyio.CapacityLimiter(2)
    async with anyio.create_task_group() as tg:
        for i, (src, role) in enumerate(plan):
            tg.start_soon(one, i, src, role, limit)
    return [counts[i] for i in range(len(plan))]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mode", default="auto", help="auto (modern era, default) or legacy (handshake era)")
    parser.add_argument("--role", action="append", choices=ROLES, help="gateway (default), relay, upstream")
    parser.add_argument("--calls", type=int, default=300, help="calls counted (default 300)")
    parser.add_argument("--warmup", type=int, default=50, help="calls made first, not counted (default 50)")
    parser.add_argument("--against", help="another src directory: counted first, as the baseline")
    parser.add_argument(
        "--extra", default="{}", help="JSON merged into the gateway's config, e.g. to turn a part off"
    )
    parser.add_argument("--keep", type=Path, help="a directory to copy each callgrind dump into")
    parser.add_argument("--serve", choices=("relay", "upstream"), help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        from agent_gateway import runtime

        runtime.run(serve, args.serve, args.upstream)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    args.role = args.role or ["gateway"]
    overhead.quiet_logging()
    print(table(anyio.run(run, args)))
    print(f"\ncommand: `.venv/bin/python bench/instructions_per_call.py {shlex.join(sys.argv[1:])}`")


if __name__ == "__main__":
    main()
