"""A restricted client learns nothing of the tools outside its policy by calling them: the
policy is checked before the name is looked up, so a tool that exists, one held for review and
a name that does not exist are refused alike (directly and through ``call_tool``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anyio

from agent_gateway.search.tools import CALL_TOOL
from tests.support import running_gateway, serving_upstream
from tests.test_access import client_with
from tests.test_search_mode import text_of, tracker_server

TOKENS = {"full": "f" * 32, "narrow": "n" * 32}


def auth_with(narrow_tools: list[str]) -> dict[str, Any]:
    return {
        "mode": "bearer",
        "tokens": [
            {"name": "full", "sha256": hashlib.sha256(TOKENS["full"].encode()).hexdigest()},
            {
                "name": "narrow",
                "sha256": hashlib.sha256(TOKENS["narrow"].encode()).hexdigest(),
                "policy": "narrow",
            },
        ],
        "policies": {"narrow": {"tools": narrow_tools}},
    }


async def test_a_held_tool_outside_a_clients_policy_is_refused_as_not_allowed_not_described(
    tmp_path: Path,
) -> None:
    """A restricted client calling a tool outside its policy gets `not allowed` and learns
    nothing of it: not that it exists, nor that pinning holds it, nor what its upstream
    changed (looked up before the policy, it was told all three)."""
    config = {
        "auth": auth_with(["tracker__list_*"]),
        "search": {"mode": "on"},
        "pinning": "hold",
        "agent": {"memory": {"path": str(tmp_path / "conversations.sqlite")}},
    }
    async with (
        serving_upstream(tracker_server([])) as url,
        running_gateway({**config, "upstreams": {"tracker": {"url": url}}}) as gw,
    ):
        async with client_with(gw.url, TOKENS["full"]) as full:
            before = gw.gateway.catalog.snapshot.version
            await full.call_tool("tracker__describe_tool", {"name": "close_issue", "description": "Changed."})
            with anyio.fail_after(10):
                while gw.gateway.catalog.snapshot.version == before:
                    await anyio.sleep(0.01)
            assert "tracker__close_issue" in gw.gateway.catalog.snapshot.held
        async with client_with(gw.url, TOKENS["narrow"]) as narrow:
            direct = await narrow.call_tool("tracker__close_issue", {"project": "p", "number": 1})
            via = await narrow.call_tool(
                CALL_TOOL, {"name": "tracker__close_issue", "arguments": {"project": "p", "number": 1}}
            )
    for answer in (direct, via):
        assert answer.is_error
        assert text_of(answer) == "tool 'tracker__close_issue' is not allowed for client 'narrow'"


async def test_a_restricted_client_cannot_tell_a_hidden_tool_from_a_missing_one() -> None:
    """A name outside the policy is refused alike whether such a tool exists or not: guessing
    names enumerates nothing (before, one that exists was "not allowed", one that does not
    "Unknown tool")."""
    config = {"auth": auth_with(["tracker__list_*"]), "search": {"mode": "on"}}
    async with (
        serving_upstream(tracker_server([])) as url,
        running_gateway({**config, "upstreams": {"tracker": {"url": url}}}) as gw,
        client_with(gw.url, TOKENS["narrow"]) as narrow,
    ):
        hidden = await narrow.call_tool(CALL_TOOL, {"name": "tracker__delete_project"})
        missing = await narrow.call_tool(CALL_TOOL, {"name": "tracker__delete_everything"})
    assert hidden.is_error
    assert missing.is_error
    assert text_of(hidden).replace("delete_project", "X") == text_of(missing).replace(
        "delete_everything", "X"
    )
