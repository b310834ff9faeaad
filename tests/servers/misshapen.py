"""A handshake-era stdio upstream whose answers to its prompts, reads and completions are
JSON of the wrong shape for JSON-RPC, written as raw JSON-RPC (an SDK server would not send
them): what it answers is chosen by the prompt's name, the read URI's last segment, the
completed argument's value, each one of ``SHAPES`` (and a prompt's, of ``CODES``: well-formed errors of odd codes)."""

from __future__ import annotations

import json
import sys
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "null": {"result": None},  # a result that is no object
    "list": {"result": [1, 2]},
    "text": {"result": "done"},
    "code": {"error": {"code": "E1", "message": "failed"}},  # an error whose code is no integer
    "nomessage": {"error": {"code": -32000}},
}
CODES: dict[str, dict[str, Any]] = {
    "bigcode": {"error": {"code": 10**30, "message": "failed"}},  # JSON-RPC's shape, past int32
    "owncode": {"error": {"code": -32099, "message": "failed its own way"}},
}


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        capabilities = {"prompts": {}, "resources": {}, "completions": {}}
        info = {"name": "misshapen", "version": "1"}
        return {
            "result": {
                "protocolVersion": params["protocolVersion"],
                "capabilities": capabilities,
                "serverInfo": info,
            }
        }
    if method == "tools/list":
        return {"result": {"tools": []}}
    if method == "prompts/list":
        return {"result": {"prompts": [{"name": shape} for shape in SHAPES | CODES]}}
    if method == "resources/list":
        return {"result": {"resources": []}}
    if method == "resources/templates/list":
        return {"result": {"resourceTemplates": [{"uriTemplate": "shape://{name}", "name": "shape"}]}}
    if method == "prompts/get":
        return (SHAPES | CODES)[params["name"]]
    if method == "resources/read":
        return SHAPES[params["uri"].removeprefix("shape://")]
    if method == "completion/complete":
        return SHAPES[params["argument"]["value"]]
    return {"result": {}}  # ping, and whatever else: an empty result


if __name__ == "__main__":  # the tests import SHAPES
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "id" in message and "method" in message:
            answered = answer(message["method"], message.get("params", {}))
            sys.stdout.buffer.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], **answered}).encode())
            sys.stdout.buffer.write(b"\n")
            sys.stdout.buffer.flush()
