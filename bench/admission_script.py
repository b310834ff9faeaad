"""What the admission script costs a request that pushes its session's expiry back, this code
against the script of another git revision, in the same run on one real Redis.

The script (``store/limits.py`` ``_ADMIT``) runs once per request of a client with a rate
limit, and once every 10 s per session for the others; when it carries a session id it pushes
that session's expiry back (the touch). This times ``SharedLimits.admit`` for a rate-limited
client on a live session, alternating the two scripts in rounds, and prints the median time per
call of each and their ratio.

Run from the repository root::

    .venv/bin/python bench/admission_script.py --against 9b6c2ed [--calls 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import mcp_types as types

from agent_gateway.access import Principal
from agent_gateway.config import StoreConfig
from agent_gateway.config_auth import ClientPolicy, RateLimit
from agent_gateway.store.client import SharedStore
from agent_gateway.store.limits import SharedLimits
from agent_gateway.store.sessions import SessionRecord, SessionRecords

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
from tests.replicas.services import redis_server

_SCRIPT = re.compile(r'^_ADMIT = """\n(.*?)^"""', re.M | re.S)


def _script_at(revision: str) -> str:
    text = subprocess.run(
        ["git", "show", f"{revision}:src/agent_gateway/store/limits.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = _SCRIPT.search(text)
    assert found is not None, f"no _ADMIT script in {revision}"
    return found.group(1)


async def _nothing(_: str) -> None:
    return None


async def _time(limits: SharedLimits, client: Principal, session: str, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        verdict = await limits.admit(client, session, opening=False)
        assert verdict is not None
        assert verdict.refused is None
    return (time.perf_counter() - start) / calls


async def main(against: str, calls: int, rounds: int) -> None:
    with redis_server() as redis:
        store = SharedStore(StoreConfig(url=redis.url, prefix="bench"))
        await store.start()
        now = SharedLimits(store, 3600, on_lost=_nothing)
        before = SharedLimits(store, 3600, on_lost=_nothing)
        before._admit = store.redis.register_script(_script_at(against))  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
        limit = RateLimit(per_minute=1_000_000, burst=100_000)
        client = Principal("alice", "default", ClientPolicy(rate_limit=limit))
        params = types.InitializeRequestParams(
            protocol_version="2025-11-25",
            capabilities=types.ClientCapabilities(),
            client_info=types.Implementation(name="bench", version="1"),
        )
        await SessionRecords(store, 3600, "bench").opened(
            SessionRecord("s1", "alice", None, params, "2025-11-25")
        )
        times: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(rounds):
            times["before"].append(await _time(before, client, "s1", calls))
            times["now"].append(await _time(now, client, "s1", calls))
        await store.close()
    b, n = statistics.median(times["before"]), statistics.median(times["now"])
    print("command: .venv/bin/python bench/admission_script.py " + shlex.join(sys.argv[1:]))
    print()
    print(f"| admission with a touch (rate-limited client, live session) | {against} | this code | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| us per request, median of {rounds} rounds of {calls:,} | {b * 1e6:.0f} | {n * 1e6:.0f} | {n / b:.2f} |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--against", required=True, help="the git revision whose script is the baseline")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    anyio.run(main, args.against, args.calls, args.rounds)
