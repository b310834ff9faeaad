"""What a replica does when it adopts a session waits on no upstream while it holds the lock
every new session on that replica waits for: an adopted session's log level is applied
upstream once the session is registered, so adoptions do not queue behind a stuck upstream
(nor does every ``initialize`` behind them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from tests.replicas.cluster import replicas
from tests.replicas.services import Redis
from tests.replicas.test_restore import request
from tests.replicas.test_sessions import BOUND, config
from tests.replicas.test_store import ACCEPT, events, opened
from tests.servers import recorder
from tests.support import serving_upstream


class HeldLevels(Middleware):
    """An upstream whose ``logging/setLevel`` waits, while ``held``, until the gateway gives
    up on it; ``together`` is set once two wait at once."""

    def __init__(self) -> None:
        self.held = False
        self.waiting = 0
        self.together = anyio.Event()

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method == "logging/setLevel" and self.held:
            self.waiting += 1
            if self.waiting == 2:
                self.together.set()
            try:
                await anyio.sleep_forever()  # until the gateway cancels it, at its bound
            finally:
                self.waiting -= 1
        return await call_next(context)


async def test_adoptions_wait_on_a_stuck_upstream_side_by_side_not_in_turn(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    levels = HeldLevels()
    server = recorder.build(lambda _: None)
    server.add_middleware(levels)
    async with serving_upstream(server) as upstream:
        data = config(redis, prefix, upstream)
        data["upstreams"] = {"rec": {"url": upstream, "protocol": "legacy"}}
        async with replicas(data, tmp_path) as cluster, httpx.AsyncClient(timeout=BOUND) as http:
            sessions: list[dict[str, str]] = []
            for level in ("debug", "info"):  # two sessions with a level, opened on replica 0
                headers = {**await opened(http, cluster.endpoint(0)), **ACCEPT}
                set_level = request(2, "logging/setLevel", {"level": level})
                assert (
                    await http.post(cluster.endpoint(0), json=set_level, headers=headers)
                ).status_code == 200
                sessions.append(headers)
            levels.held = True
            # Replica 1 adopts both by their streams: each applies its level upstream, where
            # it waits; under the session lock the second waited for the first to give up.
            async with (
                events(http, cluster.endpoint(1), sessions[0]),
                events(http, cluster.endpoint(1), sessions[1]),
            ):
                with anyio.fail_after(BOUND):
                    await levels.together.wait()
                await opened(http, cluster.endpoint(1))  # and a new session opens meanwhile
