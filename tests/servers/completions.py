"""A handshake-era stdio upstream whose completions hold more values than MCP allows (100),
written as raw JSON-RPC: an SDK server (FastMCP) would cut them itself. Its prompt ``ask``
completes its argument with ``COMPLETION_VALUES`` values (5,000 by default)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

VALUES = int(os.environ.get("COMPLETION_VALUES", "5000"))


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        capabilities = {"prompts": {}, "completions": {}}
        info = {"name": "completions", "version": "1"}
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": capabilities,
            "serverInfo": info,
        }
    if method == "prompts/list":
        return {"prompts": [{"name": "ask", "arguments": [{"name": "topic"}]}]}
    if method == "completion/complete":
        typed = params["argument"]["value"]
        return {"completion": {"values": [f"{typed}{n}" for n in range(VALUES)]}}
    return {}  # ping, and whatever else: an empty result


for line in sys.stdin.buffer:
    message = json.loads(line)
    if "id" in message and "method" in message:
        result = answer(message["method"], message.get("params", {}))
        sys.stdout.buffer.write(
            json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        )
        sys.stdout.buffer.write(b"\n")
        sys.stdout.buffer.flush()
