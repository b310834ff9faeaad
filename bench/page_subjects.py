"""The status page with clients named by long JWT subjects: its bytes and time to load with 20
sessions (and a call each) of a subject of 40,000 characters, against the same of a short one.

    PYTHONPATH=src:. python -m bench.page_subjects
"""

from __future__ import annotations

import statistics
import time
from contextlib import AsyncExitStack

import anyio
import httpx
import httpx2
import jwt
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from tests.support import running_gateway, serving_upstream
from tests.ui.test_status_page import alpha_server

SECRET = "a-shared-secret-of-at-least-32-chars!"
SESSIONS = 20
AUTH = {
    "mode": "jwt",
    "jwt": {"secret": SECRET, "algorithm": "HS256", "audience": "gw"},
    "subjects": {"ops": "ops"},
    "policies": {"ops": {"admin": True}},
}


def _bearer(subject: str) -> dict[str, str]:
    claims = {"sub": subject, "aud": "gw", "exp": int(time.time()) + 600}
    return {"Authorization": f"Bearer {jwt.encode(claims, SECRET, algorithm='HS256')}"}


async def _page(subject: str) -> tuple[int, float]:
    """The page's bytes and its load p50 (ms), ``SESSIONS`` sessions of ``subject`` open."""
    async with (
        serving_upstream(alpha_server()) as url,
        running_gateway({"upstreams": {"alpha": {"url": url}}, "auth": AUTH}) as gw,
        AsyncExitStack() as stack,
        httpx.AsyncClient(headers=_bearer("ops")) as admin,
    ):
        for _ in range(SESSIONS):
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=_bearer(subject)))
            transport = streamable_http_client(gw.url, http_client=http)
            c = await stack.enter_async_context(Client(transport, mode="legacy"))  # type: ignore[arg-type]
            await c.call_tool("alpha__weather", {"city": "Oslo"})
        times, size = [], 0
        for _ in range(20):
            started = time.perf_counter()
            size = len((await admin.get(f"{gw.base}/")).content)
            times.append((time.perf_counter() - started) * 1000)
        return size, statistics.median(times)


async def main() -> None:
    short = await _page("svc-short")
    long = await _page("svc-" + "x" * 40_000)
    print(f"{SESSIONS} sessions and calls of a short subject: {short[0]:,} bytes, {short[1]:.1f} ms p50")
    print(
        f"{SESSIONS} of a 40,004-character subject: {long[0]:,} bytes ({long[0] / short[0]:.1f}x), "
        f"{long[1]:.1f} ms p50 ({long[1] / short[1]:.1f}x)"
    )


if __name__ == "__main__":
    anyio.run(main)
