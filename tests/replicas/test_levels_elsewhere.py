"""A log level set through another replica is applied upstream by a task of the replica's own
(``downstream/level_changes.py``), not in the replicas' channel: the channel's messages are
handled one at a time, and an upstream holding its ``logging/setLevel`` answer held every
message after it for the gateway's 5 s bound on the send (a session ended elsewhere, a catalog
change, a held call's keepalive), at each level a client set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from tests.replicas.cluster import replicas
from tests.replicas.services import Redis
from tests.replicas.test_sessions import BOUND, config, counter_server
from tests.replicas.test_store import ACCEPT, opened
from tests.support import serving_upstream

HELD = "warning"
"""The level the upstream holds every ``logging/setLevel`` of until told to answer."""


class _Held(Middleware):
    def __init__(self) -> None:
        self.release = anyio.Event()
        self.holding = 0

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method == "logging/setLevel" and context.message.get("level") == HELD:
            self.holding += 1
            try:
                await self.release.wait()
            finally:
                self.holding -= 1
        return await call_next(context)


async def test_a_level_set_elsewhere_that_an_upstream_holds_holds_up_no_other_replica_message(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    held = _Held()
    server = counter_server([])
    server.add_middleware(held)
    async with (
        serving_upstream(server) as upstream,
        replicas(
            config(redis, prefix, upstream, upstreams={"counter": {"url": upstream, "protocol": "legacy"}}),
            tmp_path,
        ) as cluster,
        httpx.AsyncClient(timeout=BOUND) as http,
    ):

        async def post(replica: int, headers: dict[str, str], method: str, params: dict[str, Any]) -> int:
            request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            answer = await http.post(cluster.endpoint(replica), json=request, headers={**headers, **ACCEPT})
            return answer.status_code

        quiet, leaving = await opened(http, cluster.endpoint(0)), await opened(http, cluster.endpoint(0))
        for session in (quiet, leaving):  # both at error, both served by both replicas
            assert await post(0, session, "logging/setLevel", {"level": "error"}) == 200
            assert await post(1, session, "ping", {}) == 200
        async with anyio.create_task_group() as tg:
            # Through replica 0 (its own send held too: that request waits its 5 s); replica 1
            # hears it on the channel and asks its upstream session for it as well.
            tg.start_soon(post, 0, quiet, "logging/setLevel", {"level": HELD})
            with anyio.fail_after(BOUND):
                while held.holding < 2:
                    await anyio.sleep(0.02)
                await http.delete(cluster.endpoint(0), headers=leaving)  # ended: told on the channel
                while await post(1, leaving, "ping", {}) != 404:  # replica 1 heard it
                    await anyio.sleep(0.02)
            # Before, replica 1 read the channel's next message only once its send was given up.
            assert held.holding == 2, "replica 1's channel waited for the upstream's setLevel"
            held.release.set()
