"""An upstream that misbehaves on request, for the fault-injection tests.

``python faulty.py`` serves stdio; ``python faulty.py http PORT`` serves Streamable HTTP on
loopback. Each tool is one fault: hang, freeze the whole process, answer slowly, write a
line that is not JSON-RPC, answer a request id it was never sent, return a huge result.
On the SDK's low-level server (``lowlevel_tools.py``): the suite starts it ~75 times a run.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
from typing import Any

import anyio
import uvicorn

# A sibling module: this file runs as a script, its directory first on sys.path.
from lowlevel_tools import Context, Tools, report_progress, serve_stdio

tools = Tools()

# The pipe to the gateway. The SDK's stdio server points fd 1 (and so sys.stdout) at stderr
# while it serves, and writes the wire from a private duplicate: lines meant for the wire are
# written to this duplicate, taken before it starts.
_WIRE = os.dup(1)
_hanging: list[str] = []
"""The request ids of ``hang`` calls in flight (as FastMCP gives them: strings)."""

_INTEGER = {"type": "integer"}
_STRING = {"type": "string"}


@tools.tool("ping", "Answer at once.", "string")
def _ping(_: Context, __: dict[str, Any]) -> str:
    return "pong"


@tools.tool(
    "usage", "Fail quoting the arguments it was started with, as a server's usage error may.", "string"
)
def _usage(_: Context, __: dict[str, Any]) -> str:
    raise RuntimeError(f"unexpected arguments: {' '.join(sys.argv[1:])}")


@tools.tool("request_id", "The id this call arrived with (the gateway's own id for it upstream).", "integer")
def _request_id(ctx: Context, __: dict[str, Any]) -> int:
    return int(str(ctx.request_id))


@tools.tool(
    "asks",
    "Ask the caller ``count`` questions, one after another: how many were refused.",
    "integer",
    {"count": _INTEGER},
)
async def _asks(ctx: Context, arguments: dict[str, Any]) -> int:
    refused = 0
    schema = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}
    for _ in range(int(arguments["count"])):
        try:
            await ctx.session.elicit_form("go on?", schema, related_request_id=ctx.request_id)
        except Exception:  # the refusal, as the SDK raises it
            refused += 1
    return refused


@tools.tool("pid", "This server's process id.", "integer")
def _pid(_: Context, __: dict[str, Any]) -> int:
    return os.getpid()


@tools.tool(
    "hang",
    "Accept the call and never answer it (the process keeps answering everything else);\n"
    "``report``: report progress first (so a streamed answer has begun).",
    "string",
    {"report": {"default": False, "type": "boolean"}},
)
async def _hang(ctx: Context, arguments: dict[str, Any]) -> str:
    request_id = str(ctx.request_id)
    _hanging.append(request_id)
    if arguments.get("report", False):
        await report_progress(ctx, 0, 1)
    try:
        await anyio.sleep_forever()
    finally:
        _hanging.remove(request_id)
    return "unreachable"


@tools.tool("crash", "Exit the process at once, mid-call.", "string")
def _crash(_: Context, __: dict[str, Any]) -> str:
    sys.stdout.flush()
    os._exit(3)


@tools.tool(
    "freeze",
    "Stop the whole process (SIGSTOP): no answer, no pings, until it is continued or killed.\n"
    "Continued, it writes ``thawed`` to the file ``FAULTY_THAWED`` names, if any.",
    "string",
)
def _freeze(_: Context, __: dict[str, Any]) -> str:
    # To this thread: a signal to the process may be taken by another of its threads, and
    # this one run on a moment before the stop holds it (long enough to write the file).
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    if thawed := os.environ.get("FAULTY_THAWED"):
        with open(thawed, "w") as file:
            file.write("thawed")
    return "thawed"


@tools.tool("slow", "Answer after ``seconds``.", "string", {"seconds": {"type": "number"}})
async def _slow(_: Context, arguments: dict[str, Any]) -> str:
    seconds = float(arguments["seconds"])
    await anyio.sleep(seconds)
    return f"slept {seconds:g}s"


def _write_raw(message: object) -> None:
    # Straight to the pipe, between two protocol messages: the SDK's writer has flushed the
    # previous message and writes the call's answer after this returns. A line this short
    # is written in one piece (under PIPE_BUF), so it never splits one of the SDK's.
    line = message if isinstance(message, str) else json.dumps(message)
    os.write(_WIRE, line.encode() + b"\n")


@tools.tool(
    "mangled",
    "Answer this very call with a line that is not UTF-8 (a Latin-1 byte), then keep still:\n"
    "the real answer comes only after a minute.",
    "string",
)
async def _mangled(ctx: Context, __: dict[str, Any]) -> str:
    line = b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "caf\xe9"}]}}'
    os.write(_WIRE, line % str(ctx.request_id).encode() + b"\n")
    await anyio.sleep(60)
    return "too late"


@tools.tool(
    "oversized_note",
    "Write a log notification of about ``size`` bytes on the wire (no id: nothing answers\nit), then answer.",
    "string",
    {"size": _INTEGER},
)
def _oversized_note(_: Context, arguments: dict[str, Any]) -> str:
    params = {"level": "info", "data": "x" * int(arguments["size"])}
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
    _write_lines(1, note.encode() + b"\n")
    return "answered"


@tools.tool("garbage", "Write a line that is not JSON-RPC on stdout, then answer normally.", "string")
def _garbage(_: Context, __: dict[str, Any]) -> str:
    _write_raw("this is not json {")
    _write_raw({"jsonrpc": "2.0", "method": 42})
    return "wrote garbage"


@tools.tool(
    "stray",
    "Write responses to ids the client never sent, then answer normally: unknown ids, the\n"
    "string form of this call's own id and of each hanging call's (the client sent integers),\n"
    "and ``answered``, the id of a call already answered.",
    "string",
    {"answered": {"default": -1, "type": "integer"}},
)
def _stray(ctx: Context, arguments: dict[str, Any]) -> str:
    result = {"content": [{"type": "text", "text": "a stray answer"}], "isError": False}
    for never_sent in (987654, "no-such-id", str(ctx.request_id), *_hanging, arguments.get("answered", -1)):
        _write_raw({"jsonrpc": "2.0", "id": never_sent, "result": result})
    _write_raw({"jsonrpc": "2.0", "id": "no-such-id", "error": {"code": -1, "message": "?"}})
    return "wrote stray responses"


@tools.tool("size", "The length of ``blob`` (for large arguments).", "integer", {"blob": _STRING})
def _size(_: Context, arguments: dict[str, Any]) -> int:
    return len(arguments["blob"])


@tools.tool("big", "Return a text result of ``megabytes`` MB.", "string", {"megabytes": _INTEGER})
def _big(_: Context, arguments: dict[str, Any]) -> str:
    return "x" * (int(arguments["megabytes"]) * 1024 * 1024)


@tools.tool(
    "numbers",
    "``count`` zeros, as structured content (a JSON value each).",
    {"items": _INTEGER, "type": "array"},
    {"count": _INTEGER},
)
def _numbers(_: Context, arguments: dict[str, Any]) -> list[int]:
    return [0] * int(arguments["count"])


@tools.tool(
    "noise",
    "Write ``lines`` lines of ``line`` (blank by default: no message) to the wire, then never\nanswer.",
    "string",
    {"lines": _INTEGER, "line": {"default": "", "type": "string"}},
)
async def _noise(_: Context, arguments: dict[str, Any]) -> str:
    line = str(arguments.get("line", "")).encode() + b"\n"
    await anyio.to_thread.run_sync(_write_lines, int(arguments["lines"]), line)
    await anyio.sleep_forever()
    return "never"


@tools.tool(
    "spaced",
    "Write ``count`` short notifications to the wire, each followed by a blank line (as some\n"
    "servers end each message), in one go, then answer.",
    "string",
    {"count": _INTEGER},
)
async def _spaced(_: Context, arguments: dict[str, Any]) -> str:
    note = b'{"jsonrpc":"2.0","method":"a"}\n\n'
    await anyio.to_thread.run_sync(_write_lines, int(arguments["count"]), note)
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
    server = tools.server("faulty")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        app = server.streamable_http_app(streamable_http_path="/mcp")
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        anyio.run(serve_stdio, server)
