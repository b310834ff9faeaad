"""What parsing and writing one large JSON-RPC answer costs in memory, one way at a time.

Each row runs in a fresh process: the answer (a ``tools/call`` result whose text appears
twice, as content and as ``structuredContent``, as FastMCP sends a ``str``) is made first,
the kernel's peak RSS (``VmHWM``) is reset, then one step runs; the row is that peak over
the RSS before it. The gateway's choices (``compat/mcp.parse_message``, msgspec serialising
a handshake-era answer) against what the SDK and pydantic do by default::

    .venv/bin/python bench/json_copies.py [--megabytes 40]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

STEPS = {
    "parse: pydantic validate_json (the SDK's)": "jsonrpc_message_adapter.validate_json(body, by_name=False)",
    "parse: json.loads + validate_python": "jsonrpc_message_adapter.validate_python(json.loads(body))",
    "parse: orjson.loads + validate_python": "jsonrpc_message_adapter.validate_python(orjson.loads(body))",
    "parse: msgspec + validate_python (parse_message)": "parse_message(body)",
    "write: model_dump_json + encode (the SDK's)": "message.model_dump_json(by_alias=True, exclude_unset=True).encode()",
    "write: msgspec.json.encode(model_dump) (the gateway's)": (
        "msgspec.json.encode(message.model_dump(mode='json', by_alias=True, exclude_unset=True))"
    ),
}

_CHILD = """
import json, sys
import msgspec, orjson
from mcp_types import jsonrpc_message_adapter
from agent_gateway.compat.mcp import parse_message

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

text = "x" * (int(sys.argv[1]) * 2**20)
result = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text}, "isError": False}
body = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()
del text, result
message = parse_message(body)
if sys.argv[2].startswith("parse"):
    del message
else:
    del body
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
out = eval(sys.argv[3])
print(status("VmHWM") - before)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--megabytes", type=int, default=40, help="the result's text (the answer is twice it)"
    )
    args = parser.parse_args()
    answer = 2 * args.megabytes
    print(f"$ {Path(sys.executable).name} {' '.join(sys.argv)}\n")
    print(f"| step, on an answer of {answer} MB | peak over the RSS before it | per MB of answer |")
    print("|---|---|---|")
    for name, code in STEPS.items():
        run = [sys.executable, "-c", _CHILD, str(args.megabytes), name, code]
        peak = float(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
        print(f"| {name} | +{peak:.0f} MB | {peak / answer:.1f} |")


if __name__ == "__main__":
    main()
