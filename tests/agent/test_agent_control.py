"""Controlling a run from the client: cancellation, approvals through elicitation, progress, logs."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from mcp import Client

from agent_gateway.agent.calls import MAX_CALLS_KEPT, MAX_CALLS_PER_TURN, MAX_NAME_CHARS, MAX_REPLY_CHARS
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import BOUND, LOCAL, agent_gateway, ask, record, text
from tests.servers import recorder
from tests.support import running_gateway, serving_upstream
from tests.test_proxying import Recorded, cancels


@pytest.mark.parametrize("protocol", ["legacy", "auto"])
async def test_cancelling_ask_agent_cancels_every_tool_call_in_flight_upstream(protocol: str) -> None:
    model = ScriptedChatModel(script=[calls(call("rec__wait", seconds=30), call("rec__wait", seconds=31))])
    seen = Recorded()
    async with (
        serving_upstream(recorder.build(seen.memory.append)) as url,
        running_gateway(
            {
                "upstreams": {"rec": {"url": url, "protocol": protocol}},
                "agent": {"memory": {"store": "memory"}},
            },
            chat_model=model,
        ) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        started: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "ask_agent", {"query": "wait twice"})
            started = await seen.wait_for(lambda ev: len([e for e in ev if e["event"] == "started"]) == 2)
            tg.cancel_scope.cancel()
        # Both handlers cancelled and, for a handshake-era upstream, both notifications recorded,
        # in either order (the handler is cancelled as its notification comes in).
        events = await seen.wait_for(
            lambda ev: (
                len([e for e in ev if e["event"] == "handler_cancelled"]) == 2
                and (protocol != "legacy" or len(cancels(ev)) == 2)
            )
        )
        with anyio.fail_after(BOUND):
            while gw.gateway.status()["pending_calls"]:
                await anyio.sleep(0.01)
    ids = sorted(e["request_id"] for e in started if e["event"] == "started")
    assert sorted(e["request_id"] for e in events if e["event"] == "handler_cancelled") == ids
    # A handshake-era upstream is told by notification; a modern HTTP one by the closed stream.
    assert sorted(cancels(events)) == (ids if protocol == "legacy" else [])


def approving(action: str, asked: list[str]) -> Any:
    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=action, content={"approve": True} if action == "accept" else None)  # type: ignore[arg-type]

    return user


# "auto" speaks 2026-07-28: the run pauses for the approval, and the client's retry resumes it.
ERAS = pytest.mark.parametrize("mode", ["legacy", "auto"])


@ERAS
async def test_a_destructive_tool_runs_once_the_client_approves(tmp_path: Path, mode: str) -> None:
    asked: list[str] = []
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="users")), answer("Dropped.")])
    async with (
        agent_gateway(model, tmp_path) as (gw, math, _),
        Client(gw.url, mode=mode, elicitation_callback=approving("accept", asked)) as client,
    ):
        result = await ask(client, "Drop the users table.")
    assert not result.is_error, text(result)
    assert math.calls == [("drop_table", {"table": "users"})]
    assert len(asked) == 1
    assert "math__drop_table" in asked[0]
    assert '"table": "users"' in asked[0]
    assert record(result)["tool_calls"][0]["is_error"] is False


@ERAS
@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_a_declined_tool_is_not_run_and_the_model_is_told(
    tmp_path: Path, action: str, mode: str
) -> None:
    asked: list[str] = []
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="users")), answer("I did not.")])
    async with (
        agent_gateway(model, tmp_path) as (gw, math, _),
        Client(gw.url, mode=mode, elicitation_callback=approving(action, asked)) as client,
    ):
        result = await ask(client, "Drop the users table.")
    assert not result.is_error, text(result)
    assert math.calls == []
    assert record(result)["tool_calls"][0]["is_error"] is True
    told = [m.text for m in model.seen[1] if isinstance(m, ToolMessage)]
    verb = "declined to run" if action == "decline" else "dismissed the request to run"
    assert told == [f"The user {verb} math__drop_table. It was not run; do not try it again in this run."]


async def test_an_approval_shows_the_models_long_arguments_cut(tmp_path: Path) -> None:
    # The model chooses the arguments: a reply may hold 500,000 characters of them, all of
    # which would go into the form a person reads.
    asked: list[str] = []
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="x" * 100_000)), answer("No.")])
    async with (
        agent_gateway(model, tmp_path) as (gw, math, _),
        Client(gw.url, mode="legacy", elicitation_callback=approving("decline", asked)) as client,
    ):
        result = await ask(client, "Drop it.")
    assert not result.is_error, text(result)
    assert math.calls == []
    assert len(asked) == 1
    assert '{"table": "xxx' in asked[0]
    assert asked[0].endswith("x …. Allow it?")
    assert len(asked[0]) < 2_200, len(asked[0])


@ERAS
async def test_a_client_without_elicitation_gets_the_tool_refused_with_a_message_the_model_sees(
    tmp_path: Path, mode: str
) -> None:
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="users")), answer("Could not.")])
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode=mode) as client:
        result = await ask(client, "Drop the users table.")
    assert not result.is_error, text(result)
    assert math.calls == []
    told = [m.text for m in model.seen[1] if isinstance(m, ToolMessage)]
    assert len(told) == 1
    assert told[0].startswith("Tool math__drop_table needs the user's approval, which could not be asked")
    assert "did not declare the capability for elicitation/create" in told[0]


async def test_require_approval_globs_add_tools_and_auto_skips_destructive_ones(tmp_path: Path) -> None:
    asked: list[str] = []
    model = ScriptedChatModel(
        script=[calls(call("math__add", a=1, b=2), call("math__drop_table", table="t")), answer("Done.")]
    )
    async with (
        agent_gateway(model, tmp_path, require_approval=["math__a*"], approve_destructive="auto") as (
            gw,
            math,
            _,
        ),
        Client(gw.url, mode="legacy", elicitation_callback=approving("accept", asked)) as client,
    ):
        result = await ask(client, "Add, then drop.")
    assert not result.is_error, text(result)
    assert sorted(math.names()) == ["add", "drop_table"]
    assert len(asked) == 1
    assert "math__add" in asked[0]


async def test_a_run_reports_progress_per_model_turn_and_tool_call_and_logs_each_tool(tmp_path: Path) -> None:
    reports: list[tuple[float, str | None]] = []
    lines: list[types.LoggingMessageNotificationParams] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, message))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(params)

    model = ScriptedChatModel(script=[calls(call("math__add", a=1, b=2)), answer("3")])
    async with (
        agent_gateway(model, tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy", logging_callback=on_log) as client,
    ):
        with anyio.fail_after(BOUND):
            result = await client.call_tool("ask_agent", {"query": "1+2"}, progress_callback=on_progress)
            while len(lines) < 2:
                await anyio.sleep(0.01)
    assert not result.is_error, text(result)
    assert [m for _, m in reports] == [
        "step 1: asking the model",
        "calling math__add",
        "step 2: asking the model",
    ]
    assert [v for v, _ in reports] == [1, 2, 3]
    assert [(line.logger, line.level, line.data["event"]) for line in lines] == [
        ("ask_agent", "info", "tool_started"),
        ("ask_agent", "info", "tool_finished"),
    ]
    assert lines[0].data["arguments"] == {"a": 1, "b": 2}
    assert lines[1].data["is_error"] is False


async def test_without_a_model_or_client_sampling_the_answer_says_how_to_configure_one(
    tmp_path: Path,
) -> None:
    async with (
        running_gateway({"agent": {"memory": {"store": "memory"}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Hello?")
        modern = None
        async with Client(gw.url, mode="auto") as modern_client:
            modern = await ask(modern_client, "Hello?")
    assert result.is_error
    assert "no model is configured for the agent and this client does not offer sampling" in text(result)
    assert "agent.model" in text(result)
    assert record(result)["steps"] == 0
    assert modern.is_error
    assert "this client does not offer sampling" in text(modern)


async def test_cancelling_ask_agent_cancels_the_model_call_in_flight(tmp_path: Path) -> None:
    asked, cancelled = anyio.Event(), anyio.Event()

    async def thinking(messages: Any) -> Any:
        asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    model = ScriptedChatModel(script=[thinking])
    async with agent_gateway(model, tmp_path) as (gw, _, _), Client(gw.url, mode="legacy") as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "ask_agent", {"query": "think"})
            with anyio.fail_after(BOUND):
                await asked.wait()
            tg.cancel_scope.cancel()
        with anyio.fail_after(BOUND):
            await cancelled.wait()
            # The status page's record of the run says how it ended (it stayed "running").
            while gw.gateway.activity.runs[-1].status == "running":
                await anyio.sleep(0.01)
        run = gw.gateway.activity.runs[-1]
    assert (run.status, run.ended is not None) == ("cancelled", True)


async def test_a_cancelled_run_stays_in_the_conversation_with_its_call_marked_unfinished(
    tmp_path: Path,
) -> None:
    model = ScriptedChatModel(script=[calls(call("rec__wait", seconds=30)), answer("It may have run.")])
    seen = Recorded()
    async with (
        serving_upstream(recorder.build(seen.memory.append)) as url,
        running_gateway(
            {
                "upstreams": {"rec": {"url": url}},
                "agent": {"memory": {"store": "sqlite", "path": str(tmp_path / "m")}},
            },
            chat_model=model,
        ) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "ask_agent", {"query": "wait once"})
            await seen.wait_for(lambda ev: any(e["event"] == "started" for e in ev))
            tg.cancel_scope.cancel()
        again = await ask(client, "Did it run?")
    assert not again.is_error, text(again)
    history = model.seen[1][1:]
    assert [type(m).__name__ for m in history] == ["HumanMessage", "AIMessage", "ToolMessage", "HumanMessage"]
    assert history[0].text == "wait once"
    assert history[2].text.startswith("No result: the run ended (cancelled, failed or at its step limit)")


async def test_a_run_that_fails_before_it_starts_never_shows_another_runs_record() -> None:
    async def lend_model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="mine"), model="a-model"
        )

    async with running_gateway({"agent": {"memory": {"store": "memory"}}}) as gw:
        async with Client(gw.url, mode="legacy", sampling_callback=lend_model) as first:
            mine = await ask(first, "secret plans", conversation_id="shared")
            own = await ask(first, "and mine?")
        async with Client(gw.url, mode="legacy") as second:
            theirs = await ask(second, "what did they say?", conversation_id="shared")
    assert not mine.is_error, text(mine)
    assert record(own)["thread_id"].startswith(f"{LOCAL}session-")  # never the session id upstreams see
    assert theirs.is_error
    assert (record(theirs)["steps"], record(theirs)["model"]) == (0, "client model (sampling)")


def answering(content: dict[str, Any] | None, asked: list[str]) -> Any:
    """A user who accepts every approval form with ``content``."""

    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content=content)  # type: ignore[arg-type]

    return user


@pytest.mark.parametrize("content", [{"approve": "false"}, {"approve": 0}, {"approve": "no"}, {}])
async def test_an_accepted_approval_form_without_approve_true_runs_nothing(
    tmp_path: Path, content: dict[str, Any]
) -> None:
    # The form asks for one boolean: an answer that does not say true (a UI sending the string
    # "false" for an unticked box, no field) approves nothing.
    asked: list[str] = []
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="users")), answer("Done.")])
    async with (
        agent_gateway(model, tmp_path) as (gw, math, _),
        Client(gw.url, mode="legacy", elicitation_callback=answering(content, asked)) as client,
    ):
        result = await ask(client, "Drop the users table.")
    assert not result.is_error, text(result)
    assert len(asked) == 1
    assert math.calls == []
    [refused] = record(result)["tool_calls"]
    assert refused["is_error"] is True
    told = model.seen[1][-1]
    assert isinstance(told, ToolMessage)
    assert (
        told.text
        == "Tool math__drop_table was not run: the approval answered did not say yes (approve: true)."
    )


async def test_a_turn_over_the_call_bound_asks_approval_only_for_the_calls_it_runs(tmp_path: Path) -> None:
    # 40 destructive calls in one turn: 32 are run. The user is not asked about the 8 that
    # are refused anyway (nor flooded by a model's hundreds).
    asked: list[str] = []
    turn = calls(*(call("math__drop_table", table=f"t{i}") for i in range(40)))
    model = ScriptedChatModel(script=[turn, answer("Done.")])
    async with (
        agent_gateway(model, tmp_path) as (gw, math, _),
        Client(gw.url, mode="legacy", elicitation_callback=answering({"approve": True}, asked)) as client,
    ):
        result = await ask(client, "Drop forty tables.")
    assert not result.is_error, text(result)
    assert len(math.calls) == 32
    assert len(asked) == 32
    assert not [m for m in asked if any(f'"t{i}"' in m for i in range(32, 40))]


async def test_a_turn_of_a_thousand_calls_is_cut_to_the_calls_kept_and_32_of_them_run(tmp_path: Path) -> None:
    # A client's model answered one turn with 10,000 calls: each was logged, answered "Not
    # run" and kept, and the next request built from them held the event loop for 90 s.
    seen: list[list[Any]] = []

    def respond(messages: list[Any]) -> Any:
        if isinstance(messages[-1], ToolMessage):
            seen.append(messages)
            return answer("Done.")
        return calls(*(call("math__add", a=n, b=1) for n in range(1000)))

    model = ScriptedChatModel(respond=respond)
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Add a thousand times.")
    assert not result.is_error, text(result)
    assert len(math.calls) == MAX_CALLS_PER_TURN  # the upstream ran 32
    results = [m for m in seen[0] if isinstance(m, ToolMessage)]
    assert len(results) == MAX_CALLS_KEPT  # the model reads 128 answers, 96 of them "Not run"
    assert sum("Not run" in str(m.content) for m in results) == MAX_CALLS_KEPT - MAX_CALLS_PER_TURN
    assert len(record(result)["tool_calls"]) == MAX_CALLS_KEPT


async def test_a_reply_over_the_characters_a_run_takes_ends_the_run_before_any_call(tmp_path: Path) -> None:
    # A client's model answered each turn with 3.5 MB of arguments: every turn was kept
    # whole, and one run took 1.1 GB of memory and 446 MB of disk.
    model = ScriptedChatModel(script=[calls(call("math__drop_table", table="t" * MAX_REPLY_CHARS))])
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Drop this table.")
    assert result.is_error
    assert f"at most {MAX_REPLY_CHARS:,}" in text(result)
    assert math.calls == []


async def test_a_refusal_over_the_characters_a_run_takes_ends_the_run(tmp_path: Path) -> None:
    # OpenAI's refusal is the run's answer, so it counts as the reply's text: uncounted, a
    # refusal of 600,000 characters was taken whole into the conversation.
    refusal = AIMessage(content="", additional_kwargs={"refusal": "no" * MAX_REPLY_CHARS})
    async with (
        agent_gateway(ScriptedChatModel(script=[refusal]), tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Refuse at length.")
    assert result.is_error
    assert f"holds {2 * MAX_REPLY_CHARS:,} characters" in text(result)


@pytest.mark.parametrize(
    "reply",
    [
        AIMessage(content="  \n", additional_kwargs={"refusal": "I can't help with that."}),
        AIMessage(content=[{"type": "refusal", "refusal": "I can't help with that."}]),
    ],
    ids=["blank-content", "responses-api-block"],
)
async def test_a_refusal_beside_blank_content_or_in_a_block_is_the_answer(
    reply: AIMessage, tmp_path: Path
) -> None:
    # Chat Completions with whitespace for content, and the Responses API's refusal block
    # (langchain-openai uses that API for some models by itself): each ended the run "with an
    # empty answer".
    async with (
        agent_gateway(ScriptedChatModel(script=[reply]), tmp_path) as (gw, _, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Help me with something I should not ask")
    assert not result.is_error, text(result)
    assert text(result) == "I can't help with that."


async def test_a_tool_name_of_megabytes_is_cut_wherever_the_run_keeps_it(tmp_path: Path) -> None:
    # A client's model named a 3 MB tool: kept whole in the span's name, the run's steps, the
    # status page (57 MB a render), the checkpoint (10 MB a conversation) and the log.
    long = "math__" + "x" * 3_000_000
    model = ScriptedChatModel(script=[calls(call(long)), answer("Done.")])
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode="legacy") as client:
        result = await ask(client, "Use the long one.", conversation_id="c")
        steps = [step.name for step in gw.gateway.activity.runs[-1].steps]
    with sqlite3.connect(tmp_path / "conversations.sqlite") as db:
        kept = db.execute("SELECT SUM(LENGTH(checkpoint)) FROM checkpoints").fetchone()[0]
    assert not result.is_error
    assert math.calls == []
    assert steps == [long[:MAX_NAME_CHARS]]
    assert kept < 100_000
    told = model.seen[-1][-1]  # what the model was told of its call
    assert isinstance(told, ToolMessage)
    assert f"Unknown tool '{long[:MAX_NAME_CHARS]}'" in str(told.content)


async def test_a_cancelled_run_leaves_its_thread_with_only_its_latest_checkpoint(tmp_path: Path) -> None:
    # Each thread keeps only its latest checkpoint; a cancelled run skipped the compaction and
    # left one per step (a modern request's fresh thread is never run again: they stayed until
    # the thread's retention).
    model = ScriptedChatModel(
        script=[
            calls(call("math__add", a=1, b=1)),
            calls(call("math__add", a=2, b=2)),
            calls(call("math__meet", who="ann")),
        ]
    )
    async with agent_gateway(model, tmp_path) as (gw, math, _), Client(gw.url, mode="legacy") as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                client.call_tool, "ask_agent", {"query": "add twice then meet", "conversation_id": "c"}
            )
            with anyio.fail_after(BOUND):
                while "meet" not in math.names():
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        with anyio.fail_after(BOUND):
            while gw.gateway.activity.runs[-1].status == "running":
                await anyio.sleep(0.01)
    with sqlite3.connect(tmp_path / "conversations.sqlite") as db:
        kept = db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (f"{LOCAL}c",)).fetchone()[
            0
        ]
    assert kept == 1


async def test_a_run_past_its_run_timeout_ends_saying_so_and_its_tool_call_is_cancelled_upstream(
    tmp_path: Path,
) -> None:
    # Nothing bounded a run as a whole: ten turns of a slow model, each retried, with tool
    # calls and approvals between, held a run (its thread, its upstream calls) for over an hour.
    model = ScriptedChatModel(script=[calls(call("rec__wait", seconds=30)), answer("Back.")])
    seen = Recorded()
    async with (
        serving_upstream(recorder.build(seen.memory.append)) as url,
        running_gateway(
            {
                "upstreams": {"rec": {"url": url, "protocol": "legacy"}},
                "agent": {"memory": {"store": "sqlite", "path": str(tmp_path / "m")}, "run_timeout": 5},
            },
            chat_model=model,
        ) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        ended = await ask(client, "wait")
        events = await seen.wait_for(lambda ev: any(e["event"] == "handler_cancelled" for e in ev))
        again = await ask(client, "Are you back?")  # the thread is free, and holds the run
    assert ended.is_error
    assert "did not end within 5s (agent.run_timeout)" in text(ended), text(ended)
    assert len(cancels(events)) == 1  # the upstream was told, with its own id
    assert not again.is_error, text(again)
    run = gw.gateway.activity.runs[0]
    assert (run.status, run.run_id) == ("failed", record(ended)["run_id"])
    (made,) = [c for c in gw.gateway.activity.calls if c.run == run.run_id]  # the client's record of it
    assert (made.name, made.outcome) == ("rec__wait", "cancelled")
