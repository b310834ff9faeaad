"""A client that does not read its notification stream costs only itself: the notifications
other replicas write for it wait in a queue of its stream's own, and past a megabyte are
dropped (``compat/relays.py``). Before, the replica's one channel of announcements waited up
to 5 s on each of them, and every other session's notifications, ends and log levels waited
behind (found by a helper's attack on two replicas, stop 56)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.replicas.cluster import replicas
from tests.replicas.services import Redis
from tests.replicas.test_sessions import BOUND, TOKEN_ENV, TOKENS, bearer, config
from tests.replicas.test_store import (
    BUMP,
    SUBSCRIBE,
    UPDATED,
    RawSession,
    next_message,
    opened,
    recorder_cluster,
)
from tests.servers import recorder
from tests.support import serving_upstream

LISTEN = {"Accept": "text/event-stream"}

LONG = "note://" + "x" * 4000
"""A resource whose every update is 4 KB on the stream: 2,000 of them fill what loopback's
socket buffers hold (4 MB), and the stream's."""


@asynccontextmanager
async def unread_stream(url: str, headers: dict[str, str]) -> AsyncIterator[None]:
    """The session's notification stream, open on a socket that takes its answer's head and
    then never reads (a receive buffer of 2 KB)."""
    target = httpx.URL(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.settimeout(10)
    try:
        await anyio.to_thread.run_sync(sock.connect, (target.host, target.port))
        lines = [
            f"GET {target.path} HTTP/1.1",
            f"Host: {target.host}:{target.port}",
            "Accept: text/event-stream",
        ]
        head = "\r\n".join([*lines, *(f"{k}: {v}" for k, v in headers.items()), "", ""])
        await anyio.to_thread.run_sync(sock.sendall, head.encode())
        answer = await anyio.to_thread.run_sync(sock.recv, 1024)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        yield
    finally:
        sock.close()


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"id": 2, "method": "tools/call", "params": {"name": f"rec__{tool}", "arguments": arguments}}


async def test_a_stream_its_client_does_not_read_holds_up_no_other_sessions_notifications(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    async with recorder_cluster(redis, prefix, tmp_path, seen) as stalled:
        cluster, http = stalled.cluster, stalled.http
        # Its subscription on replica 0, its stream on replica 1: each update is relayed.
        await stalled.post(0, {"id": 1, "method": "resources/subscribe", "params": {"uri": LONG}})
        async with unread_stream(cluster.endpoint(1), stalled.headers):
            await stalled.post(0, call("updates", uri=LONG, times=2000))
            bystander = RawSession(cluster, http, await opened(http, cluster.endpoint(0)))
            async with bystander.events(1) as reader:
                await bystander.post(0, SUBSCRIBE)
                await bystander.post(0, BUMP)
                _, message = await next_message(reader)  # behind 2,000 relays, 5 s each, before
        log = cluster.log(1)
    assert message == UPDATED
    assert "does not read its notification stream" in log


async def test_a_get_naming_a_sessions_open_stream_leaves_that_stream_relayed(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    """A GET naming alice's session while her stream is open on that replica: bob's is answered
    404, her own second one 409 (an IDE reconnecting before it noticed the old stream end), and
    her open stream goes on getting what the other replica writes for it. Before, the replica
    took either GET for the session's stream first: its relay queue replaced hers and was
    dropped with the refusal, so her stream heard nothing more from the other replica (bob's
    found by a helper's isolation attack). Both GETs on one cluster (each was a test of its
    own, two replicas started for each), each followed by an update her stream must hear."""
    seen: list[dict[str, Any]] = []
    heard: list[dict[str, Any]] = []
    async with serving_upstream(recorder.build(seen.append)) as upstream:
        data = config(redis, prefix, upstream) | {
            "upstreams": {"rec": {"url": upstream, "protocol": "legacy"}},
            "auth": bearer(),
        }
        async with (
            replicas(data, tmp_path, env=TOKEN_ENV) as cluster,
            httpx.AsyncClient(timeout=BOUND) as http,
        ):
            own = {"Authorization": f"Bearer {TOKENS['alice']}"}
            alice = RawSession(cluster, http, own | await opened(http, cluster.endpoint(0), own))
            # Her subscription on replica 0, her stream on replica 1: each update is relayed.
            async with alice.events(1) as reader:
                await alice.post(0, SUBSCRIBE)
                for n, (who, status) in enumerate((("bob", 404), ("alice", 409))):
                    theirs = {**alice.headers, "Authorization": f"Bearer {TOKENS[who]}"}
                    async with http.stream(
                        "GET", cluster.endpoint(1), headers={**theirs, **LISTEN}
                    ) as refused:
                        assert refused.status_code == status, who
                    await alice.post(0, BUMP | {"id": BUMP["id"] + n})
                    _, message = await next_message(reader)
                    heard.append(message)
    assert heard == [UPDATED, UPDATED]
