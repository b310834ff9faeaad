"""A stdio MCP server of a few lines of plain Python, one tool (``hello``), for the tests of
how the gateway treats the process itself:

- ``RAW_STARTS``: a file each start of the process appends its time to;
- ``RAW_TOKEN``: before serving, writes to stderr a line holding this credential, a line of
  100,000 characters and 5,000 short lines;
- ``RAW_EXIT_AFTER_LIST``: exits once it has answered its listing (up, and at once gone);
- ``RAW_CALLS``: a file each call appends a line to;
- ``RAW_REQUESTS``: a file each request (pings too) appends its process id and method to;
- ``RAW_HANG_ON_CALL``: at its first call, writes its pid to this file, then answers nothing
  more and ignores SIGTERM (stopped only by SIGKILL);
- ``RAW_ENDINGS``: four more tools: ``held`` (the pipes and sockets it holds past 0, 1 and 2),
  ``hang_up`` (closes its stdout and runs on), ``exit`` (exits with code 3), ``sigkill``.
"""

import json
import os
import signal
import stat
import sys
import time


def held() -> list[int]:
    """What the process holds besides its stdin, stdout and stderr: pipes and sockets."""
    found = []
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # the directory listdir read, closed since
            continue
        if fd > 2 and (stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)):
            found.append(fd)
    return found


def ending(name: str) -> dict[str, object]:
    """``RAW_ENDINGS``' tools: each but ``held`` ends the process, one way or another."""
    if name == "hang_up":  # done, as far as the gateway goes: it runs on
        sys.stdout.flush()
        os.close(1)
        time.sleep(120)
    if name == "exit":
        os._exit(3)
    if name == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"content": [{"type": "text", "text": json.dumps(held())}]}


ENDINGS = ("held", "hang_up", "exit", "sigkill") if os.environ.get("RAW_ENDINGS") else ()

if starts := os.environ.get("RAW_STARTS"):
    with open(starts, "a") as record:
        record.write(f"{time.time()}\n")
if token := os.environ.get("RAW_TOKEN"):
    sys.stderr.write(f"starting with token {token}\n")
    sys.stderr.write("x" * 100_000 + "\n")
    for n in range(5000):
        sys.stderr.write(f"line {n}\n")
    sys.stderr.flush()
for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue
    method, result = request["method"], {}
    if requests := os.environ.get("RAW_REQUESTS"):
        with open(requests, "a") as record:
            record.write(f"{os.getpid()} {method}\n")
    if method == "initialize":
        result = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in ("hello", *ENDINGS)]}
    elif method == "tools/call" and request["params"]["name"] in ENDINGS:
        result = ending(request["params"]["name"])
    elif method == "tools/call" and (hung := os.environ.get("RAW_HANG_ON_CALL")):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(hung, "w") as record:
            record.write(str(os.getpid()))
        time.sleep(3600)
    elif method == "tools/call":
        if calls := os.environ.get("RAW_CALLS"):
            with open(calls, "a") as record:
                record.write("call\n")
        result = {"content": [{"type": "text", "text": "hello"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}), flush=True)
    if method == "tools/list" and os.environ.get("RAW_EXIT_AFTER_LIST"):
        break
