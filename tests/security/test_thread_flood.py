"""One client starting agent runs on new threads, as fast as its run budget lets it, against
everyone's disk: it keeps its ``agent.memory.max_threads`` most recently used threads and no
more, and another client's conversation is untouched."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent_gateway.config import MemoryConfig
from tests.agent.scripted import ScriptedChatModel, answer
from tests.agent.test_retention import stored_threads
from tests.security.test_hostile_load import _echo_server, client
from tests.security.test_identity import SECRET, token
from tests.support import RunningGateway, running_gateway, serving_upstream


@asynccontextmanager
async def gateway(model: ScriptedChatModel, memory: dict[str, Any]) -> AsyncIterator[RunningGateway]:
    async with serving_upstream(_echo_server()) as url:
        config = {
            "upstreams": {"echo": {"url": url}},
            "agent": {"memory": memory},
            "auth": {"mode": "jwt", "jwt": {"secret": SECRET, "algorithm": "HS256", "audience": "gw"}},
        }
        async with running_gateway(config, chat_model=model) as gw:
            yield gw


async def ask(gw: RunningGateway, subject: str, query: str, conversation: str | None = None) -> None:
    """One run of ``subject``'s, a modern-era client's: a new thread unless ``conversation``."""
    extra = {} if conversation is None else {"conversation_id": conversation}
    async with client(gw.url, token(sub=subject)) as c:
        result = await c.call_tool("ask_agent", {"query": query, **extra})
    assert not result.is_error, result.content


def threads_of(path: Path, subject: str) -> set[str]:
    space = "c" + hashlib.sha256(subject.encode()).hexdigest()[:32] + ":"
    return {t.removeprefix(space) for t in stored_threads(path) if t.startswith(space)}


async def test_a_client_keeps_its_most_recently_used_threads_and_no_one_elses_go(tmp_path: Path) -> None:
    path = tmp_path / "conversations.sqlite"
    model = ScriptedChatModel(respond=lambda _: answer("ok"))
    async with gateway(model, {"store": "sqlite", "path": str(path), "max_threads": 3}) as gw:
        await ask(gw, "bob", "bob's question", "bob")
        await ask(gw, "mallory", "first", "kept")
        for n in range(2):
            await ask(gw, "mallory", f"fresh {n}")
        await ask(gw, "mallory", "again", "kept")  # used again: the least recently used is another
        for n in range(2, 4):
            await ask(gw, "mallory", f"fresh {n}")
        mallorys = threads_of(path, "mallory")
        assert len(mallorys) == 3, mallorys
        assert "kept" in mallorys
        assert threads_of(path, "bob") == {"bob"}
        await ask(gw, "bob", "and now?", "bob")
    said = [str(m.content) for m in model.seen[-1] if m.type == "human"]
    assert said == ["bob's question", "and now?"]  # bob's conversation whole


def test_the_bound_is_on_by_default() -> None:
    assert MemoryConfig().max_threads == 100
