"""A client's requests with large bodies are served one at a time (``turns.py``): each such
step costs the event loop time in proportion to its body, and sixteen of one client's at
once put sixteen of them ahead of every other client's each turn of the loop. Its small
requests, and every other client's, are not held."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from fastmcp import FastMCP
from mcp import Client

from agent_gateway import turns
from agent_gateway.turns import LARGE_BODY_BYTES, turn_waits
from tests.replicas.test_store import ACCEPT, HELLO, VERSION
from tests.security.test_bytes_in_flight import until
from tests.servers import recorder
from tests.support import running_gateway, serving_upstream
from tests.test_gateway import modern_request

LARGE = "x" * (LARGE_BODY_BYTES + 1)


def waited(turn: str) -> int:
    return turn_waits._totals.get((("turn", turn),), 0)  # pyright: ignore[reportPrivateUsage]


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer: one JSON body, or the last event of a stream (a call silent past
    the keepalive interval is answered as one)."""
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(events[-1])  # type: ignore[no-any-return]
    return response.json()  # type: ignore[no-any-return]


def holding_server(entered: list[str], release: anyio.Event) -> FastMCP:
    server = FastMCP("held")

    @server.tool
    async def hold(tag: str, text: str) -> str:
        """Records that the call reached the upstream, then waits to be released."""
        entered.append(tag)
        await release.wait()
        return f"{tag}:{len(text)}"

    return server


async def test_one_clients_large_requests_take_turns_and_nobody_else_waits() -> None:
    entered: list[str] = []
    release = anyio.Event()
    answers: dict[str, str] = {}
    async with (
        serving_upstream(holding_server(entered, release)) as url,
        running_gateway({"upstreams": {"held": {"url": url}}}) as gw,
    ):

        async def call(tag: str, address: str, text: str) -> None:
            body, headers = modern_request("held__hold", {"tag": tag, "text": text})
            transport = httpx.AsyncHTTPTransport(local_address=address)
            async with httpx.AsyncClient(timeout=30, transport=transport) as http:
                answer = answer_of(await http.post(gw.url, json=body, headers=headers))
            answers[tag] = answer["result"]["content"][0]["text"]

        before, held = waited("serving"), list[str]()
        async with anyio.create_task_group() as group:
            group.start_soon(call, "first", "127.0.0.2", LARGE)
            await until(lambda: entered == ["first"])
            group.start_soon(call, "second", "127.0.0.2", LARGE)
            group.start_soon(call, "small", "127.0.0.2", "short")  # the same client, a small body
            group.start_soon(call, "other", "127.0.0.3", LARGE)  # another client, a large body
            # The second has waited its turn, and the rest reached the upstream meanwhile.
            await until(lambda: waited("serving") > before and len(entered) == 3)
            held = list(entered)
            release.set()
        assert sorted(held) == ["first", "other", "small"]
        assert entered[3:] == ["second"]  # served once the first was
    size = len(LARGE)
    assert answers == {
        "first": f"first:{size}",
        "second": f"second:{size}",
        "small": "small:5",
        "other": f"other:{size}",
    }


async def test_a_large_answer_to_a_question_of_a_large_call_is_not_held_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A handshake-era client answers the upstream's sampling request with a POST of its own,
    # while the call that caused it waits for that answer: were the answer to wait for the
    # call's turn, each would wait for the other until the call's timeout (or the turn's
    # bound on waiting, here longer than the test's).
    monkeypatch.setattr(turns, "TURN_WAIT", 60.0)

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=LARGE), model="m"
        )

    async with (
        serving_upstream(recorder.build(lambda event: None)) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy", sampling_callback=sample) as client,
    ):
        with anyio.fail_after(15):
            result = await client.call_tool("rec__sample", {"prompt": LARGE})
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert block.text == LARGE


async def test_large_initializes_waiting_their_turn_still_meet_the_session_cap() -> None:
    # Checked before the wait and counted as opening only after it, five padded initialize
    # requests of one client opened five sessions against its max_sessions of 2.
    padded = json.dumps(HELLO) + " " * (LARGE_BODY_BYTES + 1)
    sessions: list[str] = []
    config = {"auth": {"mode": "none", "policies": {"default": {"max_sessions": 2}}}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:

        async def initialize() -> None:
            answer = await http.post(
                gw.url, content=padded, headers={**ACCEPT, "content-type": "application/json"}
            )
            if answer.status_code == 200:
                sessions.append(answer.headers["mcp-session-id"])

        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(initialize)
        ping = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
        live = [
            session
            for session in sessions
            if (
                await http.post(
                    gw.url,
                    json=ping,
                    headers={**ACCEPT, "Mcp-Session-Id": session, "Mcp-Protocol-Version": VERSION},
                )
            ).status_code
            == 200
        ]
    assert len(sessions) >= 2
    assert len(live) <= 2


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_request_waits_its_turn_for_a_while_only(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # A call of minutes (a slow upstream, an agent run) holds its turn until it is answered, in
    # either era: its client's next large request is served anyway after TURN_WAIT.
    monkeypatch.setattr(turns, "TURN_WAIT", 0.5)
    entered: list[str] = []
    release = anyio.Event()
    async with (
        serving_upstream(holding_server(entered, release)) as url,
        running_gateway({"upstreams": {"held": {"url": url}}}) as gw,
        Client(gw.url, mode=mode) as first,
        Client(gw.url, mode=mode) as second,  # the same anonymous client: one address
        anyio.create_task_group() as group,
    ):
        group.start_soon(first.call_tool, "held__hold", {"tag": "long", "text": LARGE})
        await until(lambda: entered == ["long"])
        group.start_soon(second.call_tool, "held__hold", {"tag": "next", "text": LARGE})
        # While "long" still holds its turn; bounded well within the clients' 30 s read
        # timeout, which ends "long" and its turn by itself (a race the test could pass by).
        with anyio.fail_after(10):
            await until(lambda: entered == ["long", "next"])
        release.set()


@pytest.mark.parametrize("method", ["notifications/cancelled", "notifications\\/cancelled"])
async def test_a_request_its_client_cancels_while_it_waits_its_turn_is_never_served(method: str) -> None:
    # The cancel reaches the SDK's session, which has not seen the request yet: it was served
    # when its turn came, its client long gone. Now its POST is ended at once, unserved. The
    # method's slash escaped (JSON allows it; the SDK reads it so) was not seen as a cancel.
    entered: list[str] = []
    release = anyio.Event()
    answered: list[httpx.Response] = []
    json_headers = {**ACCEPT, "content-type": "application/json"}
    async with (
        serving_upstream(holding_server(entered, release)) as url,
        running_gateway({"upstreams": {"held": {"url": url}}}) as gw,
        Client(gw.url, mode="legacy") as first,
        httpx.AsyncClient(timeout=30) as http,  # the same anonymous client: one address
        anyio.create_task_group() as group,
    ):
        session = (await http.post(gw.url, json=HELLO, headers=json_headers)).headers["mcp-session-id"]
        headers = {**json_headers, "Mcp-Session-Id": session, "Mcp-Protocol-Version": VERSION}
        await http.post(
            gw.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
        )
        group.start_soon(first.call_tool, "held__hold", {"tag": "long", "text": LARGE})
        await until(lambda: entered == ["long"])

        async def call() -> None:
            params = {"name": "held__hold", "arguments": {"tag": "cancelled", "text": LARGE}}
            body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
            answered.append(await http.post(gw.url, json=body, headers=headers))

        before = waited("serving")
        group.start_soon(call)
        await until(lambda: waited("serving") > before)
        cancel = '{"jsonrpc": "2.0", "method": "' + method + '", "params": {"requestId": 7}}'
        await http.post(gw.url, content=cancel, headers=headers)
        await until(lambda: bool(answered))  # while "long" still holds the turn
        release.set()
        # The client's next large request is served after "long", with nothing between them.
        await first.call_tool("held__hold", {"tag": "after", "text": LARGE})
    assert entered == ["long", "after"]
    assert answered[0].status_code == 200
    assert answered[0].text == ""  # a stream with no event, as the SDK's transport ends one


async def test_a_large_body_whose_method_is_not_a_string_gets_an_error() -> None:
    # Its method was looked up in a set of names: a list raised TypeError, and the client got
    # its connection dropped (the property test found it).
    body = {"jsonrpc": "2.0", "id": 1, "method": ["tools/call"], "params": {"pad": LARGE}}
    async with running_gateway({}) as gw, httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(gw.url, json=body, headers={**ACCEPT, "content-type": "application/json"})
    assert answer.status_code < 500, answer.text
    assert "error" in answer.json()
