"""What a replica reads from the shared store is bounded: a value something else wrote into
Redis (a compromised peer, a tool run against the wrong database) is refused unread, and the
replica serves its other clients on."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from tests.replicas.cluster import replicas
from tests.replicas.services import Redis
from tests.replicas.test_dedicated import visits_server
from tests.replicas.test_sessions import BOUND
from tests.replicas.test_store import ACCEPT, opened
from tests.security.test_bytes_in_flight import memory_mb, reset_peak
from tests.support import serving_upstream

HUGE = 32 << 20
"""Bytes written into one field of a session's record (a replica writes at most 64 KiB)."""
VISIT = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "visits__visit", "arguments": {}},
}


@pytest.mark.parametrize(("field", "status"), [("params", 404), ("upstream:visits", 200)])
async def test_a_huge_value_in_a_session_record_is_not_read_and_the_replica_serves_on(
    redis: Redis, prefix: str, tmp_path: Path, field: str, status: int
) -> None:
    data = {
        "store": {"url": redis.url, "prefix": prefix},
        "upstreams": {"visits": {"url": "", "protocol": "legacy", "session": "per_client"}},
        "agent": {"enabled": False},
    }
    async with serving_upstream(visits_server()) as upstream:
        data["upstreams"]["visits"]["url"] = upstream
        async with replicas(data, tmp_path) as cluster, httpx.AsyncClient(timeout=BOUND) as http:
            first, second = cluster.endpoint(0), cluster.endpoint(1)
            victim, bystander = await opened(http, first), await opened(http, first)
            for headers in (victim, bystander):  # each opens its dedicated upstream session
                assert (await http.post(first, json=VISIT, headers={**headers, **ACCEPT})).status_code == 200
            async with aioredis.Redis.from_url(redis.url) as peer:
                await peer.hset(f"{prefix}:session:{victim['Mcp-Session-Id']}", field, b"x" * HUGE)
            pid = cluster.processes[1].pid
            reset_peak(pid)
            before = memory_mb(pid, "VmRSS")
            named = await http.post(second, json=VISIT, headers={**victim, **ACCEPT})
            peak = memory_mb(pid, "VmHWM") - before
            # The store is still up on that replica: it adopts the bystander's session.
            served = await http.post(second, json=VISIT, headers={**bystander, **ACCEPT})
            log = cluster.log(1)
    # A record's params unread is a session not found; an upstream session's record unread,
    # a new upstream session for the call.
    assert named.status_code == status, named.text
    assert served.status_code == 200, served.text
    # Read whole, the value was held about five times over (+150 MB for 32 MiB).
    assert peak < HUGE / 2 / (1 << 20), f"+{peak:.0f} MB at the peak"
    assert "over 1048576: not read" in log
