"""A modern client's call held across rounds while a handshake-era upstream asks it something
(``downstream/held_calls.py``): the upstream's one call is answered by the client's retry, is
its client's and tool's only, and is cancelled upstream when the client gives it up.

The client is the official ``mcp`` client in the modern era, taking each round's
``InputRequiredResult`` itself (``allow_input_required``) so the test holds the retries; the
upstream is the recording server over Streamable HTTP, handshake era, one shared session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_gateway.access import Principal
from agent_gateway.config_auth import ClientPolicy
from agent_gateway.downstream import held_bounds, held_calls
from tests.servers import recorder
from tests.support import RunningGateway, running_gateway, serving_upstream

BOUND = 10.0
NAMES = ["a", "b"]


class Seen(list[dict[str, Any]]):
    """What the upstream recorded, in order; ``until`` wakes as each event is appended."""

    def __init__(self) -> None:
        super().__init__()
        self.grew = anyio.Event()

    def append(self, event: dict[str, Any]) -> None:
        super().append(event)
        self.grew.set()
        self.grew = anyio.Event()


def upstream(seen: Seen) -> recorder.Recorder:
    """The recorder, and a tool that asks and then works on: its round waits after the answer."""
    server = recorder.build(seen.append)
    seconds = {"seconds": {"type": "number"}}

    @server.tool("ask_then_work", "Ask for a name, then work ``seconds`` on it.", seconds)
    async def _ask_then_work(ctx: recorder.Context, arguments: dict[str, Any]) -> str:
        answer = await recorder.elicit_text(ctx, "name?")
        seen.append({"event": "answered_then_working"})
        await anyio.sleep(float(arguments["seconds"]))
        return recorder.answered(answer)

    @server.tool("ask_or_work", "Ask for a name; with no answer, work ``seconds`` anyway.", seconds)
    async def _ask_or_work(ctx: recorder.Context, arguments: dict[str, Any]) -> str:
        try:
            await recorder.elicit_text(ctx, "name?")
        except Exception:  # the upstream's own choice: carry on without it
            seen.append({"event": "working_unanswered"})
        try:
            await anyio.sleep(float(arguments["seconds"]))
        except anyio.get_cancelled_exc_class():
            seen.append({"event": "work_cancelled"})
            raise
        return "worked"

    return server


@asynccontextmanager
async def gateway(
    tool_timeouts: dict[str, float] | None = None, upstream_limit: int | None = 200, **policy: Any
) -> AsyncIterator[tuple[RunningGateway, Seen]]:
    seen = Seen()
    auth = {
        "mode": "bearer",
        "tokens": [{"name": n, "token": f"${{T_{n}}}"} for n in NAMES],
        "policies": {"default": policy},
    }
    environ = {f"T_{n}": f"{n}-token-0123456789abcdef" for n in NAMES}
    async with (
        serving_upstream(upstream(seen)) as url,
        running_gateway(
            {
                "upstreams": {
                    "rec": {
                        "url": url,
                        "protocol": "legacy",
                        "tool_timeouts": tool_timeouts or {},
                        "max_concurrency": upstream_limit,
                    }
                },
                "auth": auth,
            },
            environ,
        ) as gw,
    ):
        yield gw, seen


async def unused(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("the test answers each round itself")


async def modern(stack: AsyncExitStack, gw: RunningGateway, name: str) -> Client:
    """Client ``name`` in the modern era, declaring it can answer elicitation."""
    headers = {"Authorization": f"Bearer {name}-token-0123456789abcdef"}
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30))
    return await stack.enter_async_context(
        Client(streamable_http_client(gw.url, http_client=http), mode="auto", elicitation_callback=unused)
    )


async def ask(
    client: Client, tool: str = "rec__ask", state: str | None = None, answers: dict[str, Any] | None = None
) -> types.CallToolResult | types.InputRequiredResult:
    return await client.session.call_tool(
        tool,
        {"question": "name?"} if tool == "rec__ask" else {"prompt": "hi"},
        input_responses=answers,
        request_state=state,
        allow_input_required=True,
    )


async def refusal(retry: Awaitable[types.CallToolResult | types.InputRequiredResult]) -> str:
    """Why ``retry`` was refused, by the SDK's request-state seal or by the held calls."""
    try:
        result = await retry
    except MCPError as exc:
        return f"sdk: {exc.error.message}"
    assert isinstance(result, types.CallToolResult), result
    assert result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert "is not held here" in block.text, block
    return block.text


def accepting(value: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"value": value})


async def until(seen: Seen, event: str) -> dict[str, Any]:
    with anyio.fail_after(BOUND):
        while not (found := [e for e in seen if e["event"] == event]):
            await seen.grew.wait()
    return found[0]


async def test_the_upstreams_question_goes_to_the_client_and_its_retry_answers_the_same_call() -> None:
    async with gateway() as (gw, seen), AsyncExitStack() as stack:
        a, b = await modern(stack, gw, "a"), await modern(stack, gw, "b")
        first = await ask(a)
        assert isinstance(first, types.InputRequiredResult)
        assert first.request_state is not None  # ours, sealed by the SDK's request-state boundary
        [(key, question)] = (first.input_requests or {}).items()
        assert isinstance(question, types.ElicitRequest)
        assert question.params.message == "[rec] name?"  # naming the upstream that asks

        # Another client's retry, or one for another tool, answers nothing: the call is a's.
        # (The SDK's seal refuses another client's; ours would refuse it as well.)
        for client, tool in ((b, "rec__ask"), (a, "rec__sample")):
            assert await refusal(ask(client, tool, first.request_state, {key: accepting("thief")}))

        done = await ask(a, state=first.request_state, answers={key: accepting("ada")})
        assert isinstance(done, types.CallToolResult)
        assert not done.is_error, done
        assert done.content[0] == types.TextContent(type="text", text="accept:ada")
    # One call upstream, asked once and answered by its own client's retry.
    assert [e["event"] for e in seen if e["event"] in ("asking", "answered")] == ["asking", "answered"]
    assert len(gw.gateway.proxy.held) == 0


async def test_a_round_its_client_gives_up_cancels_the_call_upstream() -> None:
    async with gateway() as (gw, seen), AsyncExitStack() as stack:
        a = await modern(stack, gw, "a")
        async with anyio.create_task_group() as tg:  # a held call (a can be asked) that waits
            tg.start_soon(a.call_tool, "rec__wait", {"seconds": 30})
            await until(seen, "started")
            tg.cancel_scope.cancel()  # the client closes the request's stream
        started = await until(seen, "started")
        cancelled = await until(seen, "handler_cancelled")
        assert cancelled["request_id"] == started["request_id"]  # the upstream's own id
        assert "progressToken" not in started["meta"]  # the client asked for no progress
        with anyio.fail_after(BOUND):
            while len(gw.gateway.proxy.held):
                await anyio.sleep(0.05)


async def test_a_question_left_unanswered_fails_upstream_and_the_call_is_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(held_calls, "ANSWER_TIMEOUT", 1.0)
    async with gateway() as (gw, seen), AsyncExitStack() as stack:
        a = await modern(stack, gw, "a")
        first = await ask(a)
        assert isinstance(first, types.InputRequiredResult)
        unanswered = await until(seen, "unanswered")
        assert "did not answer elicitation/create" in unanswered["error"]
        with anyio.fail_after(BOUND):
            while len(gw.gateway.proxy.held):
                await anyio.sleep(0.05)
        late = ask(a, state=first.request_state, answers={"elicitation-0": accepting("late")})
        assert "is not held here" in await refusal(late)


async def test_a_question_left_unanswered_gives_the_call_up_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream that carries on when its question goes unanswered is cancelled: the client
    is gone, and nobody would take the call's outcome."""
    monkeypatch.setattr(held_calls, "ANSWER_TIMEOUT", 1.0)
    async with gateway() as (gw, seen), AsyncExitStack() as stack:
        a = await modern(stack, gw, "a")
        first = await a.session.call_tool("rec__ask_or_work", {"seconds": 30}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        await until(seen, "working_unanswered")
        await until(seen, "work_cancelled")  # not 30 s of work for nobody
        with anyio.fail_after(BOUND):
            while len(gw.gateway.proxy.held):
                await anyio.sleep(0.05)


async def test_a_client_holds_at_most_its_max_concurrency_calls() -> None:
    async with gateway(max_concurrency=2) as (gw, seen), AsyncExitStack() as stack:
        a, b = await modern(stack, gw, "a"), await modern(stack, gw, "b")
        for _ in range(2):
            assert isinstance(await ask(a), types.InputRequiredResult)
        third = await ask(a)
        assert isinstance(third, types.CallToolResult)
        assert third.is_error
        assert "waiting for this client's answers" in str(third.content[0])
        assert isinstance(await ask(b), types.InputRequiredResult)  # another client is not held up
        assert len([e for e in seen if e["event"] == "asking"]) == 3  # the refused one never began


async def test_calls_let_in_side_by_side_are_bounded_when_they_ask() -> None:
    async with gateway(max_concurrency=2) as (gw, seen), AsyncExitStack() as stack:
        a = await modern(stack, gw, "a")
        assert isinstance(await ask(a), types.InputRequiredResult)
        results: list[types.CallToolResult | types.InputRequiredResult] = []

        async def call() -> None:
            results.append(await ask(a))

        async with anyio.create_task_group() as tg:  # both let in: neither had asked yet
            tg.start_soon(call)
            tg.start_soon(call)
        held = [r for r in results if isinstance(r, types.InputRequiredResult)]
        assert len(held) == 1  # 2 waiting for a's answers: the other's question was refused
        [refused] = [r for r in results if isinstance(r, types.CallToolResult)]
        assert refused.is_error
        unanswered = await until(seen, "unanswered")
        assert "calls waiting for this client's answers" in unanswered["error"]


async def test_a_call_that_ends_between_rounds_gives_its_retry_its_own_error_and_holds_room_till_then() -> (
    None
):
    async with gateway(tool_timeouts={"ask": 1}, max_concurrency=1) as (gw, seen), AsyncExitStack() as stack:
        a = await modern(stack, gw, "a")
        first = await ask(a)
        assert isinstance(first, types.InputRequiredResult)
        await until(seen, "handler_cancelled")  # the upstream's timeout (1 s) came first
        # Its outcome is kept for the retry, and counted: a client that never retries cannot
        # pile up calls (and their results) past its bound.
        kept = await ask(a)
        assert isinstance(kept, types.CallToolResult)
        assert "1 calls waiting for this client's answers" in str(kept.content[0])
        late = await ask(a, state=first.request_state, answers={"elicitation-0": accepting("late")})
        assert isinstance(late, types.CallToolResult)
        assert late.is_error
        assert "no answer within 1s" in str(late.content[0])  # the call's own failure, not "not held"
        assert len(gw.gateway.proxy.held) == 0
        assert isinstance(await ask(a), types.InputRequiredResult)  # its room is free again


async def test_one_round_of_a_call_at_a_time_and_answers_checked_before_any_is_handed_on() -> None:
    tool, arguments = "rec__ask_then_work", {"seconds": 2}
    async with gateway() as (gw, seen), AsyncExitStack() as stack:
        a = await modern(stack, gw, "a")
        first = await a.session.call_tool(tool, arguments, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        [key] = first.input_requests or {}
        content = types.TextContent(type="text", text="x")
        wrong = types.CreateMessageResult(role="assistant", content=content, model="m")
        refused = await a.session.call_tool(
            tool, arguments, input_responses={key: wrong}, request_state=first.request_state
        )
        assert refused.is_error
        assert f"the answer to {key!r} is not a elicitation/create result" in str(refused.content[0])
        texts: list[str] = []

        async def retry() -> None:
            result = await a.session.call_tool(
                tool, arguments, input_responses={key: accepting("ada")}, request_state=first.request_state
            )
            block = result.content[0]
            assert isinstance(block, types.TextContent)
            texts.append(block.text)

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(retry)
                await until(seen, "answered_then_working")
                tg.start_soon(retry)  # while the first retry's round waits on the upstream's work
    assert len(texts) == 2
    assert "being served already" in texts[0]
    assert texts[1] == "accept:ada"


async def test_a_client_with_no_concurrency_bound_holds_at_most_a_quarter_of_the_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(held_bounds, "PER_CLIENT", 2)
    async with gateway(max_concurrency=None) as (gw, seen), AsyncExitStack() as stack:
        a, b = await modern(stack, gw, "a"), await modern(stack, gw, "b")
        for _ in range(2):
            assert isinstance(await ask(a), types.InputRequiredResult)
        third = await ask(a)
        assert isinstance(third, types.CallToolResult)
        assert "2 calls waiting for this client's answers" in str(third.content[0])
        assert isinstance(await ask(b), types.InputRequiredResult)  # the room left is others'
        assert len([e for e in seen if e["event"] == "asking"]) == 3  # the refused one never began


async def test_calls_waiting_for_answers_take_half_of_an_upstreams_slots_shared_fairly() -> None:
    # A held call keeps its upstream call, and one of the upstream's slots, while its client
    # keeps no connection: 17 anonymous addresses held all 200 of an upstream's for its call
    # timeout, and every other client's calls to it were refused.
    async with gateway(upstream_limit=6) as (gw, seen), AsyncExitStack() as stack:
        a, b = await modern(stack, gw, "a"), await modern(stack, gw, "b")
        first, *rest = [await ask(a) for _ in range(3)]  # the upstream's 3 slots for waiting calls
        assert all(isinstance(held, types.InputRequiredResult) for held in [first, *rest])
        assert isinstance(first, types.InputRequiredResult)
        # b holds none there: a's oldest is ended for it; a's 2 to b's 1 then stay (a swap
        # would only move the imbalance).
        made_way = await ask(b)
        await until(seen, "handler_cancelled")
        refused = await ask(b)
        served = await b.call_tool("rec__steps", {"count": 3})
        gone = await refusal(ask(a, state=first.request_state, answers={"elicitation-0": accepting("late")}))
        cancelled = [e for e in seen if e["event"] == "handler_cancelled"]  # before the gateway stops
    assert isinstance(made_way, types.InputRequiredResult)
    assert isinstance(refused, types.CallToolResult)
    assert refused.is_error
    unanswered = [e for e in seen if e["event"] == "unanswered"]
    assert len(unanswered) == 1
    assert "upstream 'rec' has 3 calls waiting for clients' answers" in unanswered[0]["error"]
    assert len(cancelled) == 1
    assert "is not held here" in gone
    assert not served.is_error
    assert "3" in str(served.content[0])


class _Round:
    """A modern client's request serving a round (``held_rounds.RoundRequest``), as a client
    that can answer elicitation sends it."""

    client = Principal("ci", "default", ClientPolicy(), None, True)
    progress_token = None
    input_responses = None
    request_state = None
    session_id = "s"
    log_level = None
    modern = True
    capabilities = types.ClientCapabilities(elicitation=types.ElicitationCapability())

    def progress_relay(self) -> None:
        return None

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        return None

    async def elicitation_complete(
        self, upstream: str, params: types.ElicitCompleteNotificationParams, *, during_call: bool
    ) -> None:
        return None

    @property
    def lasting(self) -> Any:
        return self


async def test_a_round_whose_request_is_ended_as_its_question_wakes_it_gives_the_call_up() -> None:
    # A reload ending the round's request (its token withdrawn) in the loop step in which the
    # upstream's question woke the round: the cancel was not delivered by the finished wait,
    # the round answered with its question, and the call stayed held 300 s for nobody.
    calls = held_calls.HeldCalls()
    asking = anyio.Event()
    upstream: list[str] = []
    ending: list[bool] = []

    async def start(side: Any) -> types.CallToolResult:  # the handshake-era upstream's call
        question = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message="name?", requested_schema={"type": "object"})
        )
        asking.set()  # the reload runs next, then the round its question wakes
        try:
            await side.ask("rec", question)
        except anyio.get_cancelled_exc_class():
            upstream.append("cancelled")
            raise
        return types.CallToolResult(content=[])

    async def reload(scope: anyio.CancelScope) -> None:
        await asking.wait()
        scope.cancel()  # ``Drain.end``; the round is being served: give_up_of leaves it
        assert calls.give_up_of({"ci"}) == 0

    async with calls.running(), anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:  # the round's request's own (``Cuttable``)
            tg.start_soon(reload, scope)
            await anyio.wait_all_tasks_blocked()
            await calls.call(_Round(), "rec__ask", start)  # type: ignore[arg-type]
            await anyio.lowlevel.checkpoint()
        ending.append(scope.cancelled_caught)
        with anyio.fail_after(BOUND):
            while not upstream or len(calls):
                await anyio.sleep(0.01)
    assert ending == [True]
    assert upstream == ["cancelled"]
