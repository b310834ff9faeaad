"""What an upstream is told of its client's session is no handle on it: the id in
``_meta`` (``io.agent-gateway/session-id``) is not the client's ``Mcp-Session-Id``, which,
without auth, is all it takes to act in that session (end it, send requests and answers in
it)."""

from __future__ import annotations

from typing import Any

import httpx
from mcp import Client

from tests.servers import recorder
from tests.support import running_gateway, serving_upstream

SESSION_KEY = "io.agent-gateway/session-id"
HEADERS = {"mcp-protocol-version": "2025-11-25", "accept": "application/json, text/event-stream"}


async def test_the_session_id_an_upstream_is_told_cannot_end_its_clients_session() -> None:
    seen: list[dict[str, Any]] = []
    async with (
        serving_upstream(recorder.build(seen.append)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        first = (await client.call_tool("rec__whoami", {})).structured_content
        assert first is not None
        told = first["meta"][SESSION_KEY]
        # The upstream, as a client of the gateway (no auth here): it tries the id it was told.
        async with httpx.AsyncClient() as http:
            ended = await http.delete(gw.url, headers={**HEADERS, "mcp-session-id": told})
        second = (await client.call_tool("rec__whoami", {})).structured_content
    assert ended.status_code == 404
    assert second is not None
    assert second["meta"][SESSION_KEY] == told  # the same id for each call of the session
