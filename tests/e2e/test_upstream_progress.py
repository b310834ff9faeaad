"""Progress that server-everything reports during a call reaches the client through the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.e2e.peers import MODES, connected, gateway_url, text_of
from tests.support import npm_server

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def everything_url() -> AsyncIterator[str]:
    async with gateway_url({"everything": npm_server("server-everything", "stdio")}) as url:
        yield url


@pytest.mark.parametrize("mode", MODES)
async def test_progress_of_a_long_running_operation_reaches_the_client(
    everything_url: str, mode: str
) -> None:
    reported: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append((progress, total))

    async with connected(everything_url, mode) as client:
        result = await client.call_tool(
            "everything__trigger-long-running-operation",
            {"duration": 0.3, "steps": 3},
            progress_callback=on_progress,
        )
    assert "completed" in text_of(result).lower()
    # server-everything sends one notification per step (1/3, 2/3, 3/3) before its result.
    assert reported == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]
