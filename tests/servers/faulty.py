"""An upstream that misbehaves on request, for the fault-injection tests.

``python faulty.py`` serves stdio; ``python faulty.py http PORT`` serves Streamable HTTP on
loopback. Each tool is one fault: hang, freeze the whole process, answer slowly, write a
line that is not JSON-RPC, answer a request id it was never sent, return a huge result.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import anyio
from fastmcp import FastMCP

server = FastMCP("faulty")


@server.tool
def ping() -> str:
    """Answer at once."""
    return "pong"


@server.tool
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool
async def hang() -> str:
    """Accept the call and never answer it (the process keeps answering everything else)."""
    await anyio.sleep_forever()
    return "unreachable"


@server.tool
def freeze() -> str:
    """Stop the whole process (SIGSTOP): no answer, no pings, until it is killed."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return "thawed"


@server.tool
async def slow(seconds: float) -> str:
    """Answer after ``seconds``."""
    await anyio.sleep(seconds)
    return f"slept {seconds:g}s"


def _write_raw(line: str) -> None:
    # Straight to the pipe, between two protocol messages: FastMCP's own writer has
    # flushed the previous message and writes the call's answer after this returns.
    sys.stdout.buffer.write(line.encode() + b"\n")
    sys.stdout.buffer.flush()


@server.tool
def garbage() -> str:
    """Write a line that is not JSON-RPC on stdout, then answer normally."""
    _write_raw("this is not json {")
    _write_raw(json.dumps({"jsonrpc": "2.0", "method": 42}))
    return "wrote garbage"


@server.tool
def stray() -> str:
    """Write a response to a request id the client never sent, then answer normally."""
    _write_raw(json.dumps({"jsonrpc": "2.0", "id": 987654, "result": {"content": []}}))
    _write_raw(json.dumps({"jsonrpc": "2.0", "id": "no-such-id", "error": {"code": -1, "message": "?"}}))
    return "wrote a stray response"


@server.tool
def size(blob: str) -> int:
    """The length of ``blob`` (for large arguments)."""
    return len(blob)


@server.tool
def big(megabytes: int) -> str:
    """Return a text result of ``megabytes`` MB."""
    return "x" * (megabytes * 1024 * 1024)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run(
            transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False, log_level="WARNING"
        )
    else:
        server.run(show_banner=False, log_level="WARNING")
