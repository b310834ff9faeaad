"""A replica at its ``server.max_sessions`` adopts no session from the store: a session ended
there to make room would otherwise come back at its next request, past the bound (found by
this stop's review). Refused, its client gets 404 and opens a new one, through admission."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.replicas.services import Redis
from tests.replicas.test_sessions import cluster_of
from tests.replicas.test_store import ACCEPT, opened

PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


async def test_a_replica_at_its_bound_adopts_no_session_until_it_has_room(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    async with (
        cluster_of(redis, prefix, tmp_path, [], server={"max_sessions": 1}) as cluster,
        httpx.AsyncClient(timeout=10) as http,
    ):
        elsewhere = await opened(http, cluster.endpoint(0))
        full = await opened(http, cluster.endpoint(1))  # replica 1 holds its one session
        refused = await http.post(cluster.endpoint(1), json=PING, headers={**elsewhere, **ACCEPT})
        ended = await http.delete(cluster.endpoint(1), headers=full)
        adopted = await http.post(cluster.endpoint(1), json=PING, headers={**elsewhere, **ACCEPT})
        log = cluster.log(1)
    assert refused.status_code == 404, refused.text
    assert "not adopted, this replica holds its max_sessions" in log
    assert ended.status_code == 200
    assert adopted.status_code == 200, adopted.text
