"""The record of one ``ask_agent`` run, as its result's ``structuredContent`` gives it: the
answer, thread and run ids, steps, tool calls, token usage, tools offered, model, times.

The record is bounded as a whole, so that whatever the model does it stays well under a
client's 1 MiB bound on an answer (its answer is also the result's text, so it counts twice):
at most ``MAX_ANSWER_JSON`` of answer, ``MAX_CALLS_JSON`` of tool calls (the first ones, the
rest counted in ``tool_calls_left_out``), ``MAX_OFFERED_NAMES`` names of tools offered (their
``count`` is of all), ``MAX_ERROR_CHARS`` of error and 256 of the model's name as the
provider gave it: about 540 KiB at most. Sizes are of
JSON with every non-ASCII character escaped, never less than its UTF-8 bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AIMessage

from agent_gateway.errors import BadModelOutput
from agent_gateway.logs import clipped

MAX_CALLS_JSON = 256 * 1024
"""Characters of JSON of the tool calls a run's record keeps. Each call's arguments were cut
to 1,000 characters, but not their number (128 kept a turn, 100 turns): three turns of long
names and cut arguments made 1.4 MB of JSON, stored again at every step, and the official
client could not read a ten-turn run's answer (its event past 1 MiB)."""
MAX_ANSWER_JSON = 128 * 1024
"""Characters of JSON of the answer a record (and the result's text) keeps; a longer answer
ends with a note saying how much was cut. A reply may hold 500,000 characters: 2 MB of UTF-8
twice over, in the text and in the record."""
MAX_OFFERED_NAMES = 256
"""Names of the tools offered during a run that its record lists (public names are at most 64
characters); ``count`` says how many there were. A run of 100 turns, each finding 127 new
tools, offered 12,700."""
MAX_ERROR_CHARS = 2_000
"""Characters of a run's error message (a provider's error can quote what it was sent)."""


def new_record(thread: str, run_id: str, model: str, started: str | None = None) -> dict[str, Any]:
    """A run's record before it has done anything."""
    return {
        "answer": None,
        "thread_id": thread,
        "run_id": run_id,
        "steps": 0,
        "tool_calls": [],
        "tool_calls_left_out": 0,
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
    count = state.get("offered_count") or len(offered)  # a state stored before the count was kept
    record["offered_tools"] = {"count": count, "names": offered[:MAX_OFFERED_NAMES]}
    record["steps"] = state.get("steps", 0)
    record["tool_calls"] = list(state.get("tool_calls", []))
    record["tool_calls_left_out"] = state.get("tool_calls_left_out", 0)
    record["usage"] = dict(state.get("usage") or record["usage"])
    replies = [m for m in state.get("messages", []) if isinstance(m, AIMessage)]
    if replies and (name := replies[-1].response_metadata.get("model_name")):
        record["model"] = str(clipped(name))  # as the provider named it: cut to 256 characters
    record["ended_at"] = now()


def kept_calls(kept: list[Any], made: Iterable[Any], left_out: int) -> tuple[list[Any], int]:
    """A run's recorded calls after a step that made ``made``, and how many are left out: the
    first ones while their JSON is within ``MAX_CALLS_JSON``, the rest counted (once one is
    left out, every later one is too, so the list is the run's first calls, in order)."""
    made = list(made)
    if left_out:
        return kept, left_out + len(made)
    size = _size(kept)
    taken = list(kept)
    for index, call in enumerate(made):
        size += _size(call) + 2  # ", " between items
        if size > MAX_CALLS_JSON:
            return taken, len(made) - index
        taken.append(call)
    return taken, 0


def refusal_of(reply: AIMessage) -> str:
    """The model's words declining the request, its text empty: OpenAI's ``refusal``, which
    langchain-openai (1.8) keeps in ``additional_kwargs`` over Chat Completions, and in
    ``refusal`` content blocks over the Responses API."""
    kept = reply.additional_kwargs.get("refusal")
    words = [kept] if isinstance(kept, str) else []
    for block in reply.content if isinstance(reply.content, list) else []:
        if (
            isinstance(block, dict)
            and block.get("type") == "refusal"
            and isinstance(block.get("refusal"), str)
        ):
            words.append(block["refusal"])
    return "\n".join(words)


def final_answer(last: object) -> str:
    """The answer a run ends with: its last reply's text, or the model's refusal in its place.

    Raises:
        BadModelOutput: the reply holds neither (saying so when the model declined in no words).
    """
    answer = "" if not isinstance(last, AIMessage) else last.text if last.text.strip() else refusal_of(last)
    if answer.strip():
        return answer
    if isinstance(last, AIMessage) and last.response_metadata.get("stop_reason") == "refusal":
        raise BadModelOutput("the model declined the request (its stop reason: refusal) and wrote no answer")
    raise BadModelOutput("the model ended the run with an empty answer")


def answered(text: str) -> str:
    """A run's answer as its record (and the result's text) gives it: whole, or its start with
    a note saying how much was cut."""
    if _size(text) <= MAX_ANSWER_JSON:
        return text
    budget = MAX_ANSWER_JSON - 200  # the note
    low, high = 0, len(text)  # the longest start within the budget
    while low < high:
        middle = (low + high + 1) // 2
        if _size(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return (
        f"{text[:low]}\n[… {len(text) - low:,} more of the answer's {len(text):,} characters cut by the "
        f"gateway: a run's answer is at most {MAX_ANSWER_JSON:,} characters of JSON]"
    )


def error_text(message: str) -> str:
    """A run's error message, cut to ``MAX_ERROR_CHARS`` saying how long it was."""
    return str(clipped(message, MAX_ERROR_CHARS))


def _size(value: Any) -> int:
    return len(json.dumps(value, default=str))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
