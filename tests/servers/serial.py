"""A stdio upstream for tests that works on one request at a time, as a single-threaded server
whose tools compute does: ``work`` holds the event loop for ``WORK_SECONDS``, so every request
sent meanwhile (a ping too) waits behind it. It records whose calls it started, in order."""

from __future__ import annotations

import time

from fastmcp import FastMCP

WORK_SECONDS = 0.02

server = FastMCP("serial")
started: list[str] = []


@server.tool
async def work(who: str) -> str:
    """Compute for a few milliseconds on behalf of ``who`` (no await: nothing else runs)."""
    started.append(who)
    until = time.perf_counter() + WORK_SECONDS
    while time.perf_counter() < until:
        pass
    return who


@server.tool
def starts() -> list[str]:
    """Whose calls of ``work`` were started, in order."""
    return started


if __name__ == "__main__":
    server.run(show_banner=False)
