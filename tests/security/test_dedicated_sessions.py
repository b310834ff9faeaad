"""A client's dedicated upstream sessions (``session: per_client``) are bounded per upstream
and per client: one client opening sessions by the dozen starts no more than its share of
processes, and a newcomer takes the place of an idle session of the client holding the most.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agent_gateway import runtime
from agent_gateway.upstreams import dedicated
from agent_gateway.upstreams.dedicated import _IDLE
from tests.servers import recorder
from tests.support import RunningGateway, python_upstream, running_gateway, serving_upstream

BOUND = 10.0
NAMES = ["bystander", "attacker", *(f"c{n}" for n in range(1, 8))]


def _auth() -> dict[str, Any]:
    return {"auth": {"mode": "bearer", "tokens": [{"name": n, "token": f"${{T_{n}}}"} for n in NAMES]}}


def _tokens() -> dict[str, str]:
    return {f"T_{n}": f"{n}-token-0123456789abcdef" for n in NAMES}


async def session_of(stack: AsyncExitStack, gw: RunningGateway, name: str) -> Client:
    """A handshake-era session of client ``name``, open until ``stack`` closes."""
    headers = {"Authorization": f"Bearer {name}-token-0123456789abcdef"}
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30))
    return await stack.enter_async_context(
        Client(streamable_http_client(gw.url, http_client=http), mode="legacy")
    )


async def whoami(client: Client) -> dict[str, Any]:
    """Who answered: the upstream's process id and session id, or (``refused``) why not."""
    result = await client.call_tool("rec__whoami", {})
    if result.is_error:
        block = result.content[0]
        assert isinstance(block, types.TextContent)
        return {"refused": block.text}
    assert result.structured_content is not None
    return result.structured_content


async def settled(wanted: int) -> None:
    """Until the gateway has ``wanted`` child processes (a closed session's ends in time)."""
    with anyio.fail_after(BOUND):
        while len(runtime.child_pids()) != wanted:
            await anyio.sleep(0.05)


async def test_one_client_opening_sessions_by_the_dozen_starts_only_its_share_of_processes() -> None:
    upstream = python_upstream("recorder.py", session="per_client", protocol="legacy", max_sessions=4)
    config = {"upstreams": {"rec": upstream}} | _auth()
    async with running_gateway(config, environ=_tokens()) as gw, AsyncExitStack() as stack:
        before = len(runtime.child_pids())
        bystander = await session_of(stack, gw, "bystander")
        pid = (await whoami(bystander))["pid"]
        attacker = [await session_of(stack, gw, "attacker") for _ in range(6)]
        served: list[int] = []
        refusals: list[str] = []

        async def call(client: Client) -> None:
            answer = await whoami(client)
            served.append(answer["pid"]) if "pid" in answer else refusals.append(answer["refused"])

        async with anyio.create_task_group() as tg:
            for client in attacker:
                tg.start_soon(call, client)
        # Its share of 4 is one: one session served, five refused, saying why.
        assert len(served) == 1
        assert len(refusals) == 5
        assert all(
            "this client's 1 of its 4 sessions (max_sessions) are in use; retry later" in m for m in refusals
        )
        assert (await whoami(bystander))["pid"] == pid  # the bystander's process untouched
        await settled(before + 2)

        # Idle a while, its one session makes way for its next: still one process of its own.
        await anyio.sleep(_IDLE)
        assert (await whoami(attacker[1]))["pid"] not in (served[0], pid)
        await settled(before + 2)
        assert (await whoami(bystander))["pid"] == pid

        # A session with a call in flight is in use however long the call: never taken.
        async with anyio.create_task_group() as tg:
            tg.start_soon(attacker[1].call_tool, "rec__wait", {"seconds": 30})
            with anyio.fail_after(BOUND):
                while gw.gateway.proxy.pending() == 0:
                    await anyio.sleep(0.02)
            await anyio.sleep(_IDLE)
            assert "retry later" in (await whoami(attacker[2]))["refused"]
            tg.cancel_scope.cancel()
        assert (await whoami(bystander))["pid"] == pid


async def test_at_an_upstreams_max_sessions_a_newcomer_takes_an_idle_one_of_the_largest_holder() -> None:
    # A handshake-era upstream: its session ids tell the gateway's sessions with it apart.
    async with serving_upstream(recorder.build(lambda _: None)) as url:
        upstream = {"url": url, "session": "per_client", "protocol": "legacy", "max_sessions": 8}
        config = {"upstreams": {"rec": upstream}} | _auth()
        async with running_gateway(config, environ=_tokens()) as gw, AsyncExitStack() as stack:
            # Six clients hold one each, then the attacker its share (two of eight): the least
            # recently used sessions are others', the largest holder the attacker.
            holders = [*((f"c{n}", 0) for n in range(1, 7)), ("attacker", 0), ("attacker", 1)]
            clients = {who: await session_of(stack, gw, who[0]) for who in holders}
            first = {who: (await whoami(c))["session"] for who, c in clients.items()}
            await anyio.sleep(_IDLE)
            newcomer = await session_of(stack, gw, "c7")
            await whoami(newcomer)
            # The attacker's least recently used session made way; everyone else kept theirs.
            kept = {who: (await whoami(c))["session"] for who, c in clients.items() if who != ("attacker", 0)}
            assert kept == {who: s for who, s in first.items() if who != ("attacker", 0)}
            # Its next call finds all eight in use a moment ago: refused, not taken from another.
            # (Each used again at once, just before: the check must not wait out the second.)
            async with anyio.create_task_group() as tg:
                for who, c in [*clients.items(), (("c7", 0), newcomer)]:
                    if who != ("attacker", 0):
                        tg.start_soon(whoami, c)
            refusal = (await whoami(clients["attacker", 0]))["refused"]
            assert refusal == "upstream 'rec': all its 8 sessions (max_sessions) are in use; retry later"
            assert len(gw.gateway.dedicated.live) <= 8


async def test_a_clients_share_may_be_set_to_every_session_for_a_single_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One token for everything (a single tenant): the quarter would refuse its fifth session.
    # None of the eight may go idle before the ninth asks (on a loaded machine the ninth's
    # handshake took past the second, and one of the eight made way for it).
    monkeypatch.setattr(dedicated, "_IDLE", 60.0)
    async with serving_upstream(recorder.build(lambda _: None)) as url:
        upstream = {"url": url, "session": "per_client", "protocol": "legacy", "max_sessions": 8}
        config = {"upstreams": {"rec": upstream | {"max_sessions_per_client": 8}}} | _auth()
        async with running_gateway(config, environ=_tokens()) as gw, AsyncExitStack() as stack:
            clients = [await session_of(stack, gw, "attacker") for _ in range(8)]
            answers: list[dict[str, Any]] = []

            async def call(client: Client) -> None:
                answers.append(await whoami(client))

            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(call, client)
            ninth = await session_of(stack, gw, "attacker")
            refusal = (await whoami(ninth))["refused"]
    assert len({answer["session"] for answer in answers}) == 8
    assert (
        refusal == "upstream 'rec': this client's 8 of its 8 sessions (max_sessions) are in use; retry later"
    )


async def modern_client(stack: AsyncExitStack, gw: RunningGateway, name: str | None) -> Client:
    """A modern-era client, with ``name``'s token (None: none): each of its requests a session."""
    headers = {"Authorization": f"Bearer {name}-token-0123456789abcdef"} if name else {}
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30))
    return await stack.enter_async_context(
        Client(streamable_http_client(gw.url, http_client=http), mode="auto")
    )


async def tally(client: Client) -> int:
    result = await client.call_tool("rec__tally", {"by": 1})
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return int(result.structured_content["result"])


async def test_a_modern_client_with_a_token_keeps_its_upstream_state_across_requests_until_idle() -> None:
    """Each modern request is a session of its own; an authenticated client's dedicated upstream
    session is still its own across them (one process, its state kept), another client's is
    another, and it ends once unused for the idle timeout."""
    upstream = python_upstream("recorder.py", session="per_client", protocol="legacy")
    config = {"upstreams": {"rec": upstream}, "server": {"session_idle_timeout": 3}} | _auth()
    async with running_gateway(config, environ=_tokens()) as gw:
        before = len(runtime.child_pids())
        async with AsyncExitStack() as stack:
            one, two = await modern_client(stack, gw, "c1"), await modern_client(stack, gw, "c2")
            # c2's first: however slow its process starts, c1's session is not yet open to idle.
            other, others = await whoami(two), await tally(two)
            first, again = await whoami(one), await whoami(one)
            assert [await tally(one), await tally(one), others] == [1, 2, 1]
            assert first["pid"] == again["pid"] != other["pid"]  # kept past the request that opened it
            # In flight past two idle checks, so one of them falls inside it whatever the timing.
            await one.call_tool("rec__wait", {"seconds": 7})
            assert await tally(one) == 3  # its session was not closed under the call
        await settled(before)  # unused for 3 s: closed, their processes reaped


async def test_an_anonymous_modern_client_gets_a_fresh_upstream_session_per_request() -> None:
    """Clients behind one address cannot be told apart without a token: none may see the
    upstream state another's request left."""
    upstream = python_upstream("recorder.py", session="per_client", protocol="legacy")
    async with running_gateway({"upstreams": {"rec": upstream}}) as gw, AsyncExitStack() as stack:
        before = len(runtime.child_pids())
        client = await modern_client(stack, gw, None)
        assert [await tally(client), await tally(client)] == [1, 1]  # each in a process of its own
        await settled(before)


async def test_a_modern_clients_log_line_reaches_it_with_another_of_its_calls_in_flight() -> None:
    """Two requests of one client on its standing upstream session are that client's: a line
    the upstream sends outside either call's channel (stdio) still reaches it."""
    upstream = python_upstream("recorder.py", session="per_client", protocol="legacy")
    config = {"upstreams": {"rec": upstream}} | _auth()
    lines: list[str] = []

    async def logged(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(params.data["msg"])

    headers = {"Authorization": "Bearer c1-token-0123456789abcdef"}
    async with (
        running_gateway(config, environ=_tokens()) as gw,
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(
            streamable_http_client(gw.url, http_client=http),
            mode="auto",
            logging_callback=logged,
            log_level="debug",
        ) as client,
        anyio.create_task_group() as tg,
    ):
        await client.call_tool("rec__say", {"text": "alone"})
        tg.start_soon(client.call_tool, "rec__wait", {"seconds": 30})
        await in_flight(gw, 1)  # upstream before the line is said: two of its requests in flight
        await client.call_tool("rec__say", {"text": "with another in flight"})
        tg.cancel_scope.cancel()
    assert lines == ["alone", "with another in flight"]


async def unused(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("the test answers each round itself")


async def asking_client(stack: AsyncExitStack, gw: RunningGateway, name: str, **options: Any) -> Client:
    """A modern-era client with ``name``'s token that declares it can answer elicitation."""
    headers = {"Authorization": f"Bearer {name}-token-0123456789abcdef"}
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30))
    transport = streamable_http_client(gw.url, http_client=http)
    return await stack.enter_async_context(
        Client(transport, mode="auto", elicitation_callback=unused, **options)
    )


async def in_flight(gw: RunningGateway, calls: int) -> None:
    """Until ``calls`` calls are in flight upstream."""
    with anyio.fail_after(BOUND):
        while gw.gateway.proxy.pending() != calls:
            await anyio.sleep(0.01)


def standing_config(script: str) -> dict[str, Any]:
    return {"upstreams": {"rec": python_upstream(script, session="per_client", protocol="legacy")}} | _auth()


async def test_a_modern_clients_call_on_its_standing_session_is_held_when_the_upstream_asks() -> None:
    """The upstream of a standing session is told the client side can answer: a request that
    can is asked in rounds (a held call), as on a shared session."""
    async with running_gateway(standing_config("recorder.py"), _tokens()) as gw, AsyncExitStack() as stack:
        client = await asking_client(stack, gw, "c1")
        with anyio.fail_after(BOUND):
            first = await client.session.call_tool(
                "rec__ask", {"question": "name?"}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult), first
            [key] = first.input_requests or {}
            answer = types.ElicitResult(action="accept", content={"value": "ada"})
            done = await client.session.call_tool(
                "rec__ask",
                {"question": "name?"},
                input_responses={key: answer},
                request_state=first.request_state,
            )
    assert done.content == [types.TextContent(type="text", text="accept:ada")]


async def test_a_log_line_on_a_standing_session_goes_to_a_request_that_wants_it() -> None:
    """Request A opts in to log lines, request B of the same client (later) to none: the line
    A's call logs while B is in flight reaches the client (not B's request, which drops it)."""
    lines: list[str] = []
    said: list[bool] = []

    async def logged(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(params.data["msg"])

    async def say(client: Client) -> None:
        meta: Any = {types.LOG_LEVEL_META_KEY: "debug"}
        arguments = {"delay": 1, "text": "A's line"}
        said.append((await client.session.call_tool("rec__later_say", arguments, meta=meta)).is_error)

    async with running_gateway(standing_config("delayed.py"), _tokens()) as gw, AsyncExitStack() as stack:
        client = await asking_client(stack, gw, "c1", logging_callback=logged)
        await client.call_tool("rec__whoami", {})  # the standing session is open
        async with anyio.create_task_group() as tg:
            tg.start_soon(say, client)
            await in_flight(gw, 1)  # the first call is upstream before the second begins
            tg.start_soon(client.call_tool, "rec__wait", {"seconds": 30})  # the latest, wanting none
            with anyio.fail_after(BOUND):
                while not said:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    assert said == [False]
    assert lines == ["A's line"]


async def test_a_question_on_a_standing_session_with_two_requests_in_flight_is_refused_not_misrouted() -> (
    None
):
    """Two held calls of one client on its stdio standing session: the upstream's question
    cannot be told to be either's, so it is refused with the reason, never handed to the other."""
    async with running_gateway(standing_config("delayed.py"), _tokens()) as gw, AsyncExitStack() as stack:
        client = await asking_client(stack, gw, "c1")
        await client.call_tool("rec__whoami", {})  # the standing session is open
        results: dict[str, types.CallToolResult | types.InputRequiredResult] = {}

        async def call(name: str, tool: str, arguments: dict[str, Any]) -> None:
            results[name] = await client.session.call_tool(tool, arguments, allow_input_required=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "asks", "rec__later_ask", {"delay": 1})
            await in_flight(gw, 1)  # the first call is upstream before the second begins
            tg.start_soon(call, "waits", "rec__wait", {"seconds": 30})
            with anyio.fail_after(BOUND):
                while "asks" not in results:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    asked = results["asks"]
    assert isinstance(asked, types.CallToolResult), asked
    assert asked.is_error
    assert "whose call asks is unknown" in str(asked.content[0])
    assert "waits" not in results  # its call was not handed the question
