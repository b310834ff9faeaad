"""``conversation_id`` had no length bound, and the status page's record of each run kept its
thread whole (``activity.Run.thread``): one client's 50 kept runs (``KEEP_RUNS``) with 3 MiB
ids held 150 MB of the gateway until 50 other runs pushed them out. Found by a helper's
attack (stop 50)."""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from tests.agent.scripted import ScriptedChatModel, answer
from tests.agent.test_ask_agent import agent_gateway, ask, text


async def test_a_megabyte_conversation_id_is_refused_and_kept_nowhere(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[answer("kept")])
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        refused = await ask(client, "Hi", conversation_id="x" * 1_000_000)
        served = await ask(client, "Hi", conversation_id="x" * 256)
        kept = [len(run.thread) for run in gw.gateway.activity.runs]
    assert refused.is_error
    assert "conversation_id" in text(refused)
    assert not served.is_error, text(served)
    assert len(kept) == 1
    assert max(kept) < 1_000
