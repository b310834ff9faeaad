"""A restricted client learns nothing of the tools outside its policy by calling them: the
policy is checked before the name is looked up, so a tool that exists, one held for review and
a name that does not exist are refused alike (directly and through ``call_tool``)."""

from __future__ import annotations

from pathlib import Path

import anyio

from agent_gateway.search.tools import CALL_TOOL
from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, bearer, client
from tests.support import running_gateway, serving_upstream
from tests.test_search_mode import text_of, tracker_server

NARROW = bearer({"tools": ["tracker__list_*"]})
"""The attacker may call the tracker's list tools only; the bystander, every tool."""
ENVIRON = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}


async def test_a_held_tool_outside_a_clients_policy_is_refused_as_not_allowed_not_described(
    tmp_path: Path,
) -> None:
    """A restricted client calling a tool outside its policy gets `not allowed` and learns
    nothing of it: not that it exists, nor that pinning holds it, nor what its upstream
    changed (looked up before the policy, it was told all three)."""
    config = {
        **NARROW,
        "search": {"mode": "on"},
        "pinning": "hold",
        "agent": {"memory": {"path": str(tmp_path / "conversations.sqlite")}},
    }
    async with (
        serving_upstream(tracker_server([])) as url,
        running_gateway({**config, "upstreams": {"tracker": {"url": url}}}, environ=ENVIRON) as gw,
    ):
        async with client(gw.url, BYSTANDER_TOKEN) as full:
            before = gw.gateway.catalog.snapshot.version
            await full.call_tool("tracker__describe_tool", {"name": "close_issue", "description": "Changed."})
            with anyio.fail_after(10):
                while gw.gateway.catalog.snapshot.version == before:
                    await anyio.sleep(0.01)
            assert "tracker__close_issue" in gw.gateway.catalog.snapshot.held
        async with client(gw.url, ATTACKER_TOKEN) as narrow:
            direct = await narrow.call_tool("tracker__close_issue", {"project": "p", "number": 1})
            via = await narrow.call_tool(
                CALL_TOOL, {"name": "tracker__close_issue", "arguments": {"project": "p", "number": 1}}
            )
    for answer in (direct, via):
        assert answer.is_error
        assert text_of(answer) == "tool 'tracker__close_issue' is not allowed for client 'attacker'"


async def test_a_restricted_client_cannot_tell_a_hidden_tool_from_a_missing_one() -> None:
    """A name outside the policy is refused alike whether such a tool exists or not: guessing
    names enumerates nothing (before, one that exists was "not allowed", one that does not
    "Unknown tool")."""
    config = {**NARROW, "search": {"mode": "on"}}
    async with (
        serving_upstream(tracker_server([])) as url,
        running_gateway({**config, "upstreams": {"tracker": {"url": url}}}, environ=ENVIRON) as gw,
        client(gw.url, ATTACKER_TOKEN) as narrow,
    ):
        hidden = await narrow.call_tool(CALL_TOOL, {"name": "tracker__delete_project"})
        missing = await narrow.call_tool(CALL_TOOL, {"name": "tracker__delete_everything"})
    assert hidden.is_error
    assert missing.is_error
    assert text_of(hidden).replace("delete_project", "X") == text_of(missing).replace(
        "delete_everything", "X"
    )
