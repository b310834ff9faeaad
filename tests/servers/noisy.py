"""A handshake-era stdio upstream that sends what an SDK server would not, by the hundred,
written as raw JSON-RPC. Its tools (each answers with its own name, unless said):

- ``garble {times}``: before its answer, ``times`` lines that are not JSON-RPC and ``times``
  answers to ids never sent;
- ``flood {lines, size, during?, method?}``: ``lines`` log lines of ``size`` characters each,
  each its number and when it was written (``time.monotonic()``), as fast as the pipe takes
  them: before its answer with ``during``, else before the answer to the next
  ``logging/setLevel`` (no call is in flight then: the lines are nobody's); with ``method``,
  notifications of that method instead (the same params);
- ``churn {times, slow?}``: after its answer, ``tools/list_changed``, and again after each
  listing that follows, ``times`` in all, each listing then holding one tool more
  (``churned_N``) and, with ``slow``, answered that many seconds late;
- ``pings {times}``: ``times`` ``ping`` requests to the gateway, each with an id of a
  kilobyte, written as fast as the pipe takes them (by a thread), their answers read 200 a
  second (so they fill its stdin pipe after some 130, then wait in the gateway);
- ``answered``: how the gateway answered those pings (a JSON object: results, errors);
- ``echo {text}``: ``text``;
- ``listings``: when its tools were listed (``time.monotonic()`` each, a JSON list).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import Any

STATE: dict[str, Any] = {
    "listed": 0,
    "listings": [],
    "armed": None,
    "churn": 0,
    "slow": 0,
    "pinged": {"result": 0, "error": 0},
}


def send(message: dict[str, Any]) -> None:
    write(json.dumps(message).encode() + b"\n")


WRITING = threading.Lock()
"""Lines are written whole: ``pings`` writes from a thread of its own."""


def write(data: bytes) -> None:
    with WRITING:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


PADDING = "x" * 1000
"""Of each ping's id: its answer holds it too, so a pipe holds few answers."""


def pings(times: int) -> None:
    for n in range(times):
        send({"jsonrpc": "2.0", "id": f"ping-{n}-{PADDING}", "method": "ping"})


def tools() -> list[dict[str, Any]]:
    STATE["listings"].append(time.monotonic())
    names = [
        "garble",
        "flood",
        "churn",
        "echo",
        "listings",
        "pings",
        "answered",
        *(f"churned_{n}" for n in range(STATE["listed"])),
    ]
    return [{"name": n, "inputSchema": {"type": "object"}} for n in names]


def flood(lines: int, size: int, method: str = "notifications/message") -> None:
    for n in range(lines):
        line = f"{n} {time.monotonic():.4f} ".ljust(size, "x")  # numbered, stamped when written
        params = {"level": "info", "data": line}
        send({"jsonrpc": "2.0", "method": method, "params": params})


def after(name: str, arguments: dict[str, Any]) -> None:
    """What follows the answer to ``name`` (a tool's, or a method's)."""
    if name == "churn":
        STATE["churn"] = arguments["times"]
        STATE["slow"] = arguments.get("slow", 0)
    if name == "pings":
        threading.Thread(target=pings, args=(arguments["times"],), daemon=True).start()
    if name in ("churn", "tools/list") and STATE["churn"] > 0:
        STATE["churn"] -= 1
        STATE["listed"] += 1
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        capabilities = {"tools": {"listChanged": True}, "logging": {}}
        info = {"name": "noisy", "version": "1"}
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": capabilities,
            "serverInfo": info,
        }
    if method == "tools/list":
        time.sleep(STATE["slow"])
        return {"tools": tools()}
    if method == "logging/setLevel" and STATE["armed"] is not None:
        flood(*STATE["armed"])
        STATE["armed"] = None
    if method == "tools/call":
        name, arguments = params["name"], params.get("arguments") or {}
        if name == "garble":
            for n in range(arguments["times"]):
                write(f"not json {n}\n".encode())
                send({"jsonrpc": "2.0", "id": 10_000 + n, "result": {}})
        if name == "flood":
            flooded = (
                arguments["lines"],
                arguments["size"],
                arguments.get("method", "notifications/message"),
            )
            if arguments.get("during"):
                flood(*flooded)
            else:
                STATE["armed"] = flooded
        text = arguments["text"] if name == "echo" else name
        if name == "listings":
            text = json.dumps(STATE["listings"])
        if name == "answered":
            text = json.dumps(STATE["pinged"])
        return {"content": [{"type": "text", "text": text}]}
    return {}  # ping, logging/setLevel, and whatever else: an empty result


def read() -> None:
    """Reads stdin on a thread of its own, and counts the answers to ``pings`` there, slower
    than any gateway answers (so they wait, loaded machine or not): they are read on while
    the main thread waits to write (the pinging thread holds the pipe), as the gateway waits
    for them to be read before it reads another ping (its refusal is written first)."""
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if str(message.get("id")).startswith("ping-") and "method" not in message:
            STATE["pinged"]["error" if "error" in message else "result"] += 1
            time.sleep(0.005)
        else:
            INBOX.put(message)
    INBOX.put(None)


INBOX: queue.Queue[dict[str, Any] | None] = queue.Queue()
"""What the reader passes on to be answered; None: stdin ended."""
threading.Thread(target=read, daemon=True).start()
while (message := INBOX.get()) is not None:
    if "id" in message and "method" in message:
        params = message.get("params") or {}
        send({"jsonrpc": "2.0", "id": message["id"], "result": answer(message["method"], params)})
        if message["method"] == "tools/call":
            after(params["name"], params.get("arguments") or {})
        else:
            after(message["method"], {})
