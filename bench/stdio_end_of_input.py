"""A stdio client that half-closes stdin with calls in flight (MCP's stdio shutdown, or
``printf '…' | agent-gateway serve``): how many of its calls are answered with their
results, how many with an error, and how long the gateway takes to exit.

    python bench/stdio_end_of_input.py [--before REV] [--calls 32] [--seconds 1]

Each run starts ``agent-gateway serve --transport stdio`` on one stdio upstream
(``tests/servers/faulty.py``), sends ``--calls`` calls of its ``slow`` tool (``--seconds``
each), closes stdin once every call has been read, and reads stdout to its end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"


def run(src: Path, calls: int, seconds: float) -> tuple[int, int, float]:
    """(answered with a result, answered with an error, seconds from stdin's close to exit)."""
    with tempfile.TemporaryDirectory() as home:
        config = Path(home) / "gateway.yaml"
        upstream = {"command": sys.executable, "args": [str(SERVERS / "faulty.py")]}
        config.write_text(yaml.safe_dump({"server": {"transport": "stdio"}, "upstreams": {"slow": upstream}}))
        command = [
            sys.executable,
            "-m",
            "agent_gateway.cli",
            "--log-level",
            "error",
            "serve",
            "-c",
            str(config),
        ]
        env = {**os.environ, "PYTHONPATH": str(src)}
        gateway = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert gateway.stdin is not None
        assert gateway.stdout is not None
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "b", "version": "0"},
        }
        gateway.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}).encode() + b"\n"
        )
        gateway.stdin.flush()
        gateway.stdout.readline()
        for n in range(1, calls + 1):
            params = {"name": "slow__slow", "arguments": {"seconds": seconds}}
            message = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
            gateway.stdin.write(json.dumps(message).encode() + b"\n")
        gateway.stdin.flush()
        time.sleep(min(0.5, seconds / 2))  # every call read and at its upstream
        closed = time.monotonic()
        gateway.stdin.close()
        answers = [json.loads(line) for line in gateway.stdout.read().splitlines() if line.strip()]
        gateway.wait(60)
        took = time.monotonic() - closed
    results = sum(1 for a in answers if "result" in a and not a["result"].get("isError"))
    return results, len(answers) - results, took


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", help="also run against this git revision (a worktree of it)")
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    codes = [("this change", ROOT / "src")]
    if args.before:
        where = Path(tempfile.gettempdir()) / f"stdio-before-{args.before}"
        if not where.exists():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), args.before], check=True
            )
        codes.append((f"before ({args.before})", where / "src"))
    print(f"$ python bench/stdio_end_of_input.py {' '.join(sys.argv[1:])}\n")
    print("| code | calls | answered with their results | answered with an error | stdin closed to exit, s |")
    print("|---|---|---|---|---|")
    for name, src in codes:
        results, errors, took = run(src, args.calls, args.seconds)
        print(f"| {name} | {args.calls} | {results} | {errors} | {took:.2f} |")


if __name__ == "__main__":
    main()
