"""What conversation memory keeps: a thread's latest checkpoint only, and a thread only until it
has gone unused for ``agent.memory.retention_days``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated, TypedDict

import anyio
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from mcp import Client

from agent_gateway.agent.memory import Conversations
from agent_gateway.config import MemoryConfig
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import BOUND, LOCAL, agent_gateway, ask, text

SECONDS = 1 / 86_400  # retention_days is in days


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def echo(state: Chat) -> Chat:
    return Chat(messages=[AIMessage(f"echo {len(state['messages'])}")])


def thread(name: str) -> RunnableConfig:
    return RunnableConfig(configurable={"thread_id": name})


async def five_runs_compacted(conversations: Conversations) -> list[str]:
    """Five runs on thread ``t``, each compacted; the texts of its last state's messages."""
    graph = StateGraph(Chat)
    graph.add_node("echo", echo)
    graph.add_edge(START, "echo")
    app = graph.compile(checkpointer=await conversations.checkpointer())
    for n in range(5):
        await app.ainvoke(Chat(messages=[HumanMessage(f"q{n}")]), thread("t"))
        await conversations.compact("t")
    state = await app.aget_state(thread("t"))
    return [m.text for m in state.values["messages"]]


async def test_the_in_memory_store_keeps_only_a_threads_latest_checkpoint() -> None:
    async with Conversations(MemoryConfig(store="memory")) as conversations:
        texts = await five_runs_compacted(conversations)
        saver = await conversations.checkpointer()
        assert isinstance(saver, InMemorySaver)
        assert len([c async for c in saver.alist(thread("t"))]) == 1
        # One stored value per channel, not one per step.
        assert len([k for k in saver.blobs if k[0] == "t"]) <= 3
    assert texts[-2:] == ["q4", "echo 9"]


async def test_an_unused_in_memory_thread_expires_and_a_used_one_stays() -> None:
    await an_unused_thread_expires_and_a_used_one_stays(
        MemoryConfig(store="memory", retention_days=1.0 * SECONDS)
    )


async def an_unused_thread_expires_and_a_used_one_stays(config: MemoryConfig) -> None:
    """With ``config``'s store (a retention of a second)."""
    async with Conversations(config) as conversations:
        await conversations.checkpointer()
        await conversations.used("old", "someone")
        with anyio.fail_after(BOUND):
            while await conversations.expired() != ["old"]:
                await anyio.sleep(0.02)
        await conversations.used("old", "someone")  # a run began on it since: it is kept
        assert await conversations.forget("old") is False
        with anyio.fail_after(BOUND):
            while not await conversations.expired():
                await anyio.sleep(0.02)
        assert await conversations.forget("old") is True
        assert await conversations.expired() == []


def stored_threads(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT DISTINCT thread_id FROM checkpoints")}


async def test_the_gateway_deletes_a_thread_unused_for_its_retention_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    path = tmp_path / "conversations.sqlite"
    memory = {"store": "sqlite", "path": str(path), "retention_days": 3 * SECONDS}
    model = ScriptedChatModel(respond=lambda _: answer("ok"))
    async with (
        agent_gateway(model, tmp_path, memory=memory) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        await ask(client, "Remember 7.", conversation_id="old")
        with anyio.fail_after(BOUND):
            # "fresh" is used while "old" ages: "old" goes, "fresh" stays.
            while f"{LOCAL}old" in stored_threads(path):
                await ask(client, "Still here.", conversation_id="fresh")
                await anyio.sleep(0.1)
        assert stored_threads(path) == {f"{LOCAL}fresh"}
        again = await ask(client, "What was it?", conversation_id="old")
    assert not again.is_error, text(again)
    # The conversation starts over: the model sees only the new question.
    assert [m.text for m in model.seen[-1][1:]] == ["What was it?"]


async def test_a_clients_threads_past_its_bound_go_in_the_in_memory_store() -> None:
    await a_clients_least_recently_used_threads_past_its_bound_go(MemoryConfig(store="memory", max_threads=2))


async def test_a_clients_threads_past_its_bound_go_in_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "conversations.sqlite"
    await a_clients_least_recently_used_threads_past_its_bound_go(
        MemoryConfig(store="sqlite", path=str(path), max_threads=2)
    )


async def a_clients_least_recently_used_threads_past_its_bound_go(config: MemoryConfig) -> None:
    """With ``config``'s store, two threads a client."""
    async with Conversations(config) as conversations:
        await conversations.checkpointer()
        for name in ("a1", "a2", "a3"):
            await conversations.used(name, "a")
        await conversations.used("b1", "b")
        await conversations.used("a1", "a")  # used again: a2 is now the least recently used
        assert await conversations.crowded("a") == ["a2"]
        assert await conversations.crowded("b") == []
        assert await conversations.evict("a3", "a") is False  # within the bound: kept
        assert await conversations.evict("a2", "a") is True
        assert await conversations.crowded("a") == []
        await conversations.used("a2", "b")  # a new thread, of another client
        assert await conversations.crowded("a") == []
        assert await conversations.crowded("b") == []


async def test_a_run_whose_turn_grows_past_four_context_windows_ends_before_more_is_sent_or_run(
    tmp_path: Path,
) -> None:
    # The current turn is sent (and kept) whole: a model echoing 32 calls of 15,000 characters
    # a turn ran all its 10 steps, kept 13 MB in the thread and wrote 320 MB to SQLite in one
    # run, and its record (every call's arguments) was past the client's 1 MiB event limit.
    echo = calls(*[call("words__upper", text="x" * 15_000) for _ in range(32)])
    model = ScriptedChatModel(script=[echo] * 9 + [answer("Done.")])
    async with agent_gateway(model, tmp_path) as (gw, _, words), Client(gw.url, mode="legacy") as client:
        ended = await ask(client, "Shout it all.", conversation_id="loud")
    assert ended.is_error
    assert "more than 128,000 (4 times agent.max_context_tokens)" in text(ended)
    # The first step's results were cut to the bound (the model read why); its second echo
    # took the turn past it, and no call of it was run.
    assert len(model.seen) == 2
    assert count_tokens_approximately(model.seen[1]) <= 128_000
    assert len(words.calls) == 32
    with sqlite3.connect(tmp_path / "conversations.sqlite") as db:
        (kept,) = db.execute(
            "SELECT sum(length(checkpoint)) + sum(length(metadata)) FROM checkpoints"
        ).fetchone()
    assert kept < 3_000_000
