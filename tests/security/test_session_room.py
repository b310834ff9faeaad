"""A client at its ``max_sessions`` gets its next session by ending the one it left idle the
longest, as its idle timeout would have (many clients never say DELETE: reconnecting, each
time a new session, one locked itself out for 30 minutes; and every anonymous client on one
address is one client, so one local process holding the address's sessions shut out every
other local IDE). A session with a request or its stream open is never ended for it: when
all are, the client is refused as before. Found by a helper's attack (stop 51)."""

from __future__ import annotations

import anyio
import httpx

from tests.replicas.test_store import ACCEPT, events, opened
from tests.support import running_gateway

PING = {"jsonrpc": "2.0", "id": 9, "method": "ping"}


async def status(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int:
    return (await http.post(url, json=PING, headers={**headers, **ACCEPT})).status_code


async def test_a_client_at_its_cap_ends_its_session_idle_the_longest_and_never_a_busy_one() -> None:
    config = {"auth": {"mode": "none", "policies": {"default": {"max_sessions": 3}}}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        busy = await opened(http, gw.url)
        async with events(http, gw.url, busy):  # its notification stream open: never idle
            oldest, recent = await opened(http, gw.url), await opened(http, gw.url)
            # Both used again, this one first: it is the one idle the longest.
            assert await status(http, gw.url, oldest) == 200
            assert await status(http, gw.url, recent) == 200
            newest = await opened(http, gw.url)  # at the cap: "oldest" ends for it
            with anyio.fail_after(10):
                while await status(http, gw.url, oldest) != 404:
                    await anyio.sleep(0.02)
            assert [await status(http, gw.url, h) for h in (busy, recent, newest)] == [200, 200, 200]
            async with events(http, gw.url, recent), events(http, gw.url, newest):
                refused = await http.post(gw.url, json=PING | {"method": "initialize"}, headers=ACCEPT)
    assert refused.status_code == 429, refused.text
    assert "sessions open" in refused.text
