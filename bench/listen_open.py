"""How long a modern client's ``subscriptions/listen`` stream naming many resources takes to open.

The gateway subscribes upstream to every resource a stream names before it serves the stream.
This measures the time from ``client.listen(...)`` to the stream being open, for streams naming
``--counts`` resources of an upstream that answers each subscribe after ``--delays`` ms (0: an
upstream on this machine; 5-50: a remote one's round trip), with the subscribes made
``JOIN_CONCURRENCY`` (16) at a time (``side by side``) and, as the baseline in the same run,
one at a time (``one at a time``, the code before: ``JOIN_CONCURRENCY`` set to 1).

The upstream is a FastMCP server (handshake era, ``resources/subscribe``) in a process of its
own over loopback Streamable HTTP, as deployed; the gateway runs in this process, the client is
the official ``mcp`` client in the modern era. Each cell is the median of ``--repeat`` streams.

    .venv/bin/python bench/listen_open.py [--counts 100,1000] [--delays 0,5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from mcp import Client

from agent_gateway.downstream import subscriptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.servers import watched
from tests.support import running_gateway


@contextlib.asynccontextmanager
async def upstream_process(delay: float) -> AsyncIterator[str]:
    """``tests/servers/watched.py`` answering each subscribe after ``delay`` ms, served by a
    child process; its URL. Its output goes nowhere: a pipe nobody reads fills with uvicorn's
    access log after ~3,500 requests and the upstream stops in ``write()``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, __file__, "--serve", str(port), "--delays", str(delay)]
    child = await anyio.open_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while True:
                with contextlib.suppress(OSError):
                    await anyio.connect_tcp("127.0.0.1", port)
                    break
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        child.terminate()
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await child.wait()


async def opening(delay: float, count: int, repeat: int, joins: int) -> float:
    """Median seconds until a stream naming ``count`` resources is open, with ``joins``
    subscribes at a time; each stream through a gateway and an upstream of its own, so no
    stream's figure includes the letting go of the one before."""
    uris = [f"item://{n}" for n in range(count)]
    times: list[float] = []
    subscriptions.JOIN_CONCURRENCY = joins
    for _ in range(repeat):
        async with upstream_process(delay) as url:
            config = {
                "upstreams": {"w": {"url": url, "protocol": "legacy"}},
                "auth": {"policies": {"default": {"max_subscriptions": count}}},
            }
            async with running_gateway(config) as gw, Client(gw.url) as client:
                began = time.perf_counter()
                async with client.listen(resource_subscriptions=uris):
                    times.append(time.perf_counter() - began)
    return statistics.median(times)


async def main(counts: list[int], delays: list[float], repeat: int) -> None:
    rows: list[tuple[int, float, float, float]] = []
    for delay in delays:
        for count in counts:
            before = await opening(delay, count, repeat, joins=1)
            after = await opening(delay, count, repeat, joins=16)
            rows.append((count, delay, before, after))
    print("command: .venv/bin/python bench/listen_open.py " + shlex.join(sys.argv[1:]))
    print()
    print("| resources named | upstream's subscribe, ms | one at a time, ms | side by side, ms | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for count, delay, before, after in rows:
        print(f"| {count:,} | {delay:g} | {before * 1e3:,.0f} | {after * 1e3:,.0f} | {before / after:.1f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--counts", default="100,1000", help="resources per stream (default 100,1000)")
    parser.add_argument("--delays", default="0,5", help="the upstream's ms per subscribe (default 0,5)")
    parser.add_argument("--repeat", type=int, default=3, help="streams per cell (default 3)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the upstream's process
    args = parser.parse_args()
    if args.serve is not None:
        watched.build([], subscribe_delay=float(args.delays) / 1000).run(
            "http", host="127.0.0.1", port=args.serve, show_banner=False
        )
        sys.exit(0)
    anyio.run(
        main,
        [int(c) for c in args.counts.split(",")],
        [float(d) for d in args.delays.split(",")],
        args.repeat,
    )
