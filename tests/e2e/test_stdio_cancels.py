"""A stdio client's ``notifications/cancelled`` and the bound on its requests in flight: a
cancel releases its request's place only once the SDK has settled it unanswered. Before, any
cancel naming a request in flight released it at once, though a request whose handler had
returned was still answered (the SDK ignores a cancel then): a client writing each request
with a cancel of it, and reading no answers, was read without end, each answer held in a task
blocked on the full stdout (20,000 listings: 163 to 613 MB in 16 s)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from agent_gateway.downstream.stdout import MAX_IN_FLIGHT
from tests.e2e.peers import BOUND
from tests.e2e.test_stdio_client_bounds import call, exited, stdio_config, stdio_gateway, undrained_gateway
from tests.e2e.test_stdio_gateway import AGENT_GATEWAY, serve_args

pytestmark = pytest.mark.e2e

PAIRS = 3000


def _listing(request_id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/list"}).encode() + b"\n"


def _cancel(request_id: int) -> bytes:
    params = {"requestId": request_id, "reason": "changed my mind"}
    return (
        json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}).encode() + b"\n"
    )


async def _taken(fd: int, data: bytes) -> int:
    """Bytes of ``data`` the non-blocking ``fd``'s reader took before it stopped taking them
    (two seconds without room in the pipe), or all of them."""
    taken = waited = 0
    while taken < len(data) and waited < 40:
        try:
            taken += os.write(fd, data[taken : taken + 65536])
            waited = 0
        except BlockingIOError:
            waited += 1
            await anyio.sleep(0.05)
    return taken


async def test_a_client_cancelling_each_request_it_wrote_is_still_held_back_when_reading_no_answers(
    tmp_path: Path,
) -> None:
    args = [AGENT_GATEWAY, *serve_args(stdio_config(tmp_path, tmp_path / "calls", drain=1))]
    async with undrained_gateway(args, subprocess.DEVNULL) as gateway:
        assert gateway.stdin is not None
        # Each listing's handler returns at once: its answer waits on the full stdout, and
        # the cancel that follows it reaches a request the SDK answers still.
        flood = b"".join(_listing(n) + _cancel(n) for n in range(PAIRS))
        with anyio.fail_after(120):
            taken = await _taken(gateway.stdin.fileno(), flood)
        gateway.stdin.close()
        await exited(gateway)
    # What the bound lets in (64 requests, the answers the stdout pipe holds) and the 64 KiB
    # the stdin pipe holds: a small part of the flood.
    assert taken < len(flood) // 2, f"{taken} of the flood's {len(flood)} bytes read"


async def test_calls_cancelled_while_running_release_their_places_in_flight(tmp_path: Path) -> None:
    # The SDK answers a call its client cancelled in time no more: its place must be freed
    # all the same, or a client cancelling its calls would be held back for ever.
    async with stdio_gateway(serve_args(stdio_config(tmp_path, tmp_path / "calls"))) as (
        process,
        stdin,
        replies,
    ):
        count = MAX_IN_FLIGHT * 2
        await stdin.send(b"".join(call(n, "slow__slow", seconds=60) + _cancel(n) for n in range(count)))
        with anyio.fail_after(BOUND):
            await stdin.send(call(count))
            answer = json.loads(await replies.receive_until(b"\n", 1_000_000))
            await stdin.aclose()
            await process.wait()
    assert answer["id"] == count, answer  # the cancelled calls were never answered
    assert "result" in answer, answer
