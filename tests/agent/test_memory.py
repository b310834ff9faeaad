"""What the model is sent: the system message always, recent history trimmed by tokens from a
user turn, and no tool call without its result."""

from __future__ import annotations

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage

from agent_gateway.agent.memory import model_view


def turn(n: int, words: int = 50) -> list[AnyMessage]:
    """One exchange: a question, a tool call, its result, an answer (about ``words`` words each)."""
    filler = " ".join(["word"] * words)
    return [
        HumanMessage(f"question {n} {filler}"),
        AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": f"c{n}"}]),
        ToolMessage(f"result {n} {filler}", tool_call_id=f"c{n}"),
        AIMessage(f"answer {n} {filler}"),
    ]


def test_short_history_is_sent_whole_after_the_system_message() -> None:
    history = turn(1) + turn(2)
    view = model_view("be brief", history, max_tokens=10_000)
    assert isinstance(view[0], SystemMessage)
    assert view[0].text == "be brief"
    assert view[1:] == history


def test_long_history_keeps_the_system_message_and_starts_on_a_user_turn() -> None:
    history = [message for n in range(20) for message in turn(n)]
    view = model_view("be brief", history, max_tokens=600)
    assert isinstance(view[0], SystemMessage)
    assert isinstance(view[1], HumanMessage)
    assert len(view) < len(history)
    assert view[-1] == history[-1]
    assert view[1].text.startswith("question ")
    _assert_calls_answered(view)


def test_a_current_turn_larger_than_the_budget_is_still_sent_whole() -> None:
    history = turn(1) + turn(2, words=5_000)
    view = model_view("be brief", history, max_tokens=300)
    assert view[1:] == turn(2, words=5_000)


def test_a_tool_call_left_without_a_result_is_answered_with_a_note() -> None:
    # A run cancelled mid-call, or ended by the step limit, leaves calls unanswered.
    history: list[AnyMessage] = [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "lost"}]),
        HumanMessage("next question"),
    ]
    view = model_view("sys", history, max_tokens=10_000)
    assert [type(m).__name__ for m in view] == [
        "SystemMessage",
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "HumanMessage",
    ]
    note = view[3]
    assert isinstance(note, ToolMessage)
    assert note.tool_call_id == "lost"
    assert note.status == "error"


def _assert_calls_answered(view: list[AnyMessage]) -> None:
    answered = {m.tool_call_id for m in view if isinstance(m, ToolMessage)}
    for message in view:
        if isinstance(message, AIMessage):
            assert {c["id"] for c in message.tool_calls} <= answered
