"""The record of one ``ask_agent`` run, as its result's ``structuredContent`` gives it: the
answer, thread and run ids, steps, tool calls, token usage, tools offered, model, times."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AIMessage


def new_record(thread: str, run_id: str, model: str, started: str | None = None) -> dict[str, Any]:
    """A run's record before it has done anything."""
    return {
        "answer": None,
        "thread_id": thread,
        "run_id": run_id,
        "steps": 0,
        "tool_calls": [],
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "offered_tools": {"count": 0, "names": []},
        "model": model,
        "started_at": started or now(),
        "ended_at": None,
        "error": None,
    }


def fill(record: dict[str, Any], state: Mapping[str, Any]) -> None:
    """``record`` brought up to the graph's ``state`` at the run's end."""
    offered = list(state.get("offered_seen") or [])
    record["offered_tools"] = {"count": len(offered), "names": offered}
    record["steps"] = state.get("steps", 0)
    record["tool_calls"] = list(state.get("tool_calls", []))
    record["usage"] = dict(state.get("usage") or record["usage"])
    replies = [m for m in state.get("messages", []) if isinstance(m, AIMessage)]
    if replies and (name := replies[-1].response_metadata.get("model_name")):
        record["model"] = name
    record["ended_at"] = now()


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
