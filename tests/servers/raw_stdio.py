"""A stdio MCP server of a few lines of plain Python, one tool (``hello``), for the tests of
how the gateway treats the process itself:

- ``RAW_STARTS``: a file each start of the process appends its time to;
- ``RAW_TOKEN``: before serving, writes to stderr a line holding this credential, a line of
  100,000 characters and 5,000 short lines;
- ``RAW_EXIT_AFTER_LIST``: exits once it has answered its listing (up, and at once gone);
- ``RAW_CALLS``: a file each call appends a line to;
- ``RAW_HANG_ON_CALL``: at its first call, writes its pid to this file, then answers nothing
  more and ignores SIGTERM (stopped only by SIGKILL).
"""

import json
import os
import signal
import sys
import time

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
    if method == "initialize":
        result = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [{"name": "hello", "inputSchema": {"type": "object"}}]}
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
