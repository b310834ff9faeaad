"""An upstream that misbehaves on request, for the fault-injection tests.

``python faulty.py`` serves stdio; ``python faulty.py http PORT`` serves Streamable HTTP on
loopback. Each tool is one fault: hang, freeze the whole process, answer slowly, write a
line that is not JSON-RPC, answer a request id it was never sent, return a huge result.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading

import anyio
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError

server = FastMCP("faulty")

# The pipe to the gateway. The SDK's stdio server points fd 1 (and so sys.stdout) at stderr
# while it serves, and writes the wire from a private duplicate: lines meant for the wire are
# written to this duplicate, taken before it starts.
_WIRE = os.dup(1)
_hanging: list[str] = []
"""The request ids of ``hang`` calls in flight (as FastMCP gives them: strings)."""


@server.tool
def ping() -> str:
    """Answer at once."""
    return "pong"


@server.tool
def usage() -> str:
    """Fail quoting the arguments it was started with, as a server's usage error may."""
    raise ToolError(f"unexpected arguments: {' '.join(sys.argv[1:])}")


@server.tool
def request_id(ctx: Context) -> int:
    """The id this call arrived with (the gateway's own id for it upstream)."""
    return int(ctx.request_id)


@server.tool
async def asks(ctx: Context, count: int) -> int:
    """Ask the caller ``count`` questions, one after another: how many were refused."""
    refused = 0
    for _ in range(count):
        try:
            await ctx.elicit("go on?", response_type=str)
        except Exception:  # the refusal, as the SDK raises it
            refused += 1
    return refused


@server.tool
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool
async def hang(ctx: Context, report: bool = False) -> str:
    """Accept the call and never answer it (the process keeps answering everything else);
    ``report``: report progress first (so a streamed answer has begun)."""
    _hanging.append(ctx.request_id)
    if report:
        await ctx.report_progress(0, 1)
    try:
        await anyio.sleep_forever()
    finally:
        _hanging.remove(ctx.request_id)
    return "unreachable"


@server.tool
def crash() -> str:
    """Exit the process at once, mid-call."""
    sys.stdout.flush()
    os._exit(3)


@server.tool
def freeze() -> str:
    """Stop the whole process (SIGSTOP): no answer, no pings, until it is continued or killed.
    Continued, it writes ``thawed`` to the file ``FAULTY_THAWED`` names, if any."""
    # To this thread: a signal to the process may be taken by another of its threads, and
    # this one run on a moment before the stop holds it (long enough to write the file).
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    if thawed := os.environ.get("FAULTY_THAWED"):
        with open(thawed, "w") as file:
            file.write("thawed")
    return "thawed"


@server.tool
async def slow(seconds: float) -> str:
    """Answer after ``seconds``."""
    await anyio.sleep(seconds)
    return f"slept {seconds:g}s"


def _write_raw(message: object) -> None:
    # Straight to the pipe, between two protocol messages: the SDK's writer has flushed the
    # previous message and writes the call's answer after this returns. A line this short
    # is written in one piece (under PIPE_BUF), so it never splits one of the SDK's.
    line = message if isinstance(message, str) else json.dumps(message)
    os.write(_WIRE, line.encode() + b"\n")


@server.tool
async def mangled(ctx: Context) -> str:
    """Answer this very call with a line that is not UTF-8 (a Latin-1 byte), then keep still:
    the real answer comes only after a minute."""
    line = b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "caf\xe9"}]}}'
    os.write(_WIRE, line % str(int(ctx.request_id)).encode() + b"\n")
    await anyio.sleep(60)
    return "too late"


@server.tool
def oversized_note(size: int) -> str:
    """Write a log notification of about ``size`` bytes on the wire (no id: nothing answers
    it), then answer."""
    params = {"level": "info", "data": "x" * size}
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
    _write_lines(1, note.encode() + b"\n")
    return "answered"


@server.tool
def garbage() -> str:
    """Write a line that is not JSON-RPC on stdout, then answer normally."""
    _write_raw("this is not json {")
    _write_raw({"jsonrpc": "2.0", "method": 42})
    return "wrote garbage"


@server.tool
def stray(ctx: Context, answered: int = -1) -> str:
    """Write responses to ids the client never sent, then answer normally: unknown ids, the
    string form of this call's own id and of each hanging call's (the client sent integers),
    and ``answered``, the id of a call already answered."""
    result = {"content": [{"type": "text", "text": "a stray answer"}], "isError": False}
    for never_sent in (987654, "no-such-id", ctx.request_id, *_hanging, answered):
        _write_raw({"jsonrpc": "2.0", "id": never_sent, "result": result})
    _write_raw({"jsonrpc": "2.0", "id": "no-such-id", "error": {"code": -1, "message": "?"}})
    return "wrote stray responses"


@server.tool
def size(blob: str) -> int:
    """The length of ``blob`` (for large arguments)."""
    return len(blob)


@server.tool
def big(megabytes: int) -> str:
    """Return a text result of ``megabytes`` MB."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool
def numbers(count: int) -> list[int]:
    """``count`` zeros, as structured content (a JSON value each)."""
    return [0] * count


@server.tool
async def noise(lines: int, line: str = "") -> str:
    """Write ``lines`` lines of ``line`` (blank by default: no message) to the wire, then never
    answer."""
    await anyio.to_thread.run_sync(_write_lines, lines, line.encode() + b"\n")
    await anyio.sleep_forever()
    return "never"


@server.tool
async def spaced(count: int) -> str:
    """Write ``count`` short notifications to the wire, each followed by a blank line (as some
    servers end each message), in one go, then answer."""
    note = b'{"jsonrpc":"2.0","method":"a"}\n\n'
    await anyio.to_thread.run_sync(_write_lines, count, note)
    return "spaced"


def _write_lines(lines: int, line: bytes) -> None:
    """Write ``lines`` copies of ``line`` to the wire."""
    batch = 65536 // len(line) + 1
    for start in range(0, lines, batch):
        data = memoryview(line * min(batch, lines - start))
        while data:
            try:
                data = data[os.write(_WIRE, data) :]
            except BlockingIOError:  # the wire may be non-blocking (the SDK's duplicate shares it)
                select.select([], [_WIRE], [])


if __name__ == "__main__":
    # FAULTY_BANNER=N: N lines of a start-up banner on the wire before serving, as a server
    # that prints its progress to stdout does (its output is no message).
    _write_lines(int(os.environ.get("FAULTY_BANNER", "0")), b"starting: loading the models, please wait...\n")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run(
            transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False, log_level="WARNING"
        )
    else:
        server.run(show_banner=False, log_level="WARNING")
