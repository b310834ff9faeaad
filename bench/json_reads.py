"""What admission's reads of a client's JSON text cost before it is parsed (``json_text``: its
value count past the bound, its depth), on bodies a client may send within the README's
defaults (4 MiB, 100,000 values) and on one listing an upstream may send: this checkout
against another (``--against``, the ``src`` of the code before), alternating, each run a
child process. Each figure is the median of ``REPEATS`` reads of the body, in ms.

    .venv/bin/python bench/json_reads.py --against /tmp/wt-before/src [--runs 2]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its neighbours importable
from search_latency import alternated, printed

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 5
MAX_BODY = 4 * 2**20
DEEP = b"[" * 200  # past the depth check's bracket count, so each body is read through


def _call(arguments: bytes) -> bytes:
    head = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"'
    return (head + DEEP + arguments)[: MAX_BODY - 4] + b'"}}}'


def bodies() -> dict[str, bytes]:
    """Each body by what it is made of."""
    tools = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(200_000)]
    return {
        "escaped quotes (4 MiB)": _call(b'\\"' * MAX_BODY),
        "newline escapes (4 MiB)": _call(b"\\n" * MAX_BODY),
        "commas in a string, then 100,001 commas": b"["
        + DEEP
        + b'"'
        + b"," * 3_000_000
        + b'"'
        + b",0" * 100_001,
        "100,000 short strings": json.dumps(["a[b"] * 99_000).encode(),
        "129 opening brackets, then 4 MiB of closing ones": b"[" * 129 + b"]" * (MAX_BODY - 129),
        "50,000 levels opened and closed": b"[" * 50_000 + b"]" * 50_000,
        "a listing of 200,000 tools (11 MB)": json.dumps({"result": {"tools": tools}}).encode(),
    }


def measure() -> dict[str, float]:
    from agent_gateway.json_text import json_values, nests_deeper

    figures: dict[str, float] = {}
    for name, body in bodies().items():
        times = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            json_values(body, 100_000)
            nests_deeper(body)
            times.append((time.perf_counter() - started) * 1e3)
        figures[name] = statistics.median(times)
    return figures


def main() -> None:
    rows = alternated("json_reads", (__doc__ or "").splitlines()[0])
    printed(rows, {f"{name}, ms": (name, ".1f") for name in rows["before"][0]})


if __name__ == "__main__":
    main()
