"""What a replica does when it adopts a session waits on no upstream while it holds the lock
every new session on that replica waits for: an adopted session's log level is applied
upstream once the session is registered, so adoptions do not queue behind a stuck upstream
(nor does every ``initialize`` behind them). The levels themselves go to one upstream
session one at a time (a client's flood of them took its slots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

from tests.replicas.cluster import replicas
from tests.replicas.services import Redis
from tests.replicas.test_restore import request
from tests.replicas.test_sessions import BOUND, config
from tests.replicas.test_store import ACCEPT, events, opened
from tests.servers import recorder
from tests.support import serving_upstream


class HeldLevels:
    """An upstream whose ``logging/setLevel`` waits, while ``held``, until the gateway gives
    up on it (``gave_up`` counts those); ``waiting`` is set once one waits."""

    def __init__(self) -> None:
        self.held = False
        self.gave_up = 0
        self.waiting = anyio.Event()
        self.released = anyio.Event()
        """Set once the test has looked: what still waits is let go (the upstream's shutdown
        waited 5 s for it, the replica that asked being gone)."""

    async def __call__(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "logging/setLevel" and self.held:
            self.waiting.set()
            try:
                await self.released.wait()  # until the gateway cancels it, at its bound
            except anyio.get_cancelled_exc_class():
                self.gave_up += 1
                raise
        return await call_next(ctx)


async def test_an_adoption_does_not_wait_on_another_adoptions_stuck_upstream(
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
            # Replica 1 adopts both by their streams: the first applies its level upstream,
            # where it waits. Under the session lock, the second adoption (and every new
            # session on replica 1) waited for it to be given up (5 s).
            async with events(http, cluster.endpoint(1), sessions[0]):
                with anyio.fail_after(BOUND):
                    await levels.waiting.wait()
                async with events(http, cluster.endpoint(1), sessions[1]):
                    given_up = levels.gave_up
            levels.released.set()
    assert given_up == 0
