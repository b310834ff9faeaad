"""A client's cancel of a prompts/get, resources/read or completion/complete reaches the
upstream as a tools/call's does (``test_proxying``): ``notifications/cancelled`` under the
upstream's own request id (a modern HTTP upstream: its request's stream closed), observed at
a recording upstream; and a question the upstream is asking the client for a call cancelled
meanwhile is withdrawn at the client too."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.agent.scripted import ScriptedChatModel, call, calls
from tests.servers import recorder
from tests.support import running_gateway, serving_upstream
from tests.test_proxying import (
    BOUND,
    MODES,
    UPSTREAMS,
    Recorded,
    cancelled_once_started,
    cancels,
    recorded_gateway,
)

REQUESTS: dict[str, Callable[[Client], Coroutine[Any, Any, Any]]] = {
    "prompt": lambda client: client.get_prompt("rec__waiting", {"seconds": "30"}),
    "resource": lambda client: client.read_resource("wait://30"),
    "completion": lambda client: client.complete(
        types.PromptReference(type="ref/prompt", name="rec__waiting"), {"name": "seconds", "value": "30"}
    ),
}


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", list(REQUESTS))
async def test_a_cancelled_render_read_or_completion_is_cancelled_upstream_under_its_own_id(
    what: str, transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, seen),
        Client(gw.url, mode=mode) as client,
    ):
        started, events = await cancelled_once_started(
            lambda: REQUESTS[what](client), seen, transport, protocol
        )
    modern_http = transport == "http" and protocol != "legacy"
    upstream_id = started["request_id"]
    assert started["what"] == what
    assert [e["request_id"] for e in events if e["event"] == "handler_cancelled"] == [upstream_id]
    assert cancels(events) == ([] if modern_http else [upstream_id])


class Asked:
    """A client's answers to sampling and elicitation that never come: it notes being asked,
    and the question's withdrawal (its callback cancelled by the gateway's notification)."""

    def __init__(self) -> None:
        self.asked, self.withdrawn = anyio.Event(), anyio.Event()

    async def _never(self) -> Any:
        self.asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.withdrawn.set()

    async def elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        return await self._never()

    async def sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        return await self._never()


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize(
    ("tool", "arguments"), [("ask", {"question": "name?"}), ("sample", {"prompt": "hi"})]
)
async def test_a_call_cancelled_while_its_client_is_asked_withdraws_the_question_too(
    tool: str, arguments: dict[str, str], transport: str, tmp_path: Path
) -> None:
    """The upstream's elicitation (or sampling) request relayed to the client is cancelled
    there when the client cancels the call it came during, as the upstream's SDK cancels its
    own when its handler is: before, the client was left answering for a call that no longer
    was (a dialog open, its model sampling), the relay waiting on it."""
    client_side = Asked()
    async with (
        recorded_gateway(transport, tmp_path, protocol="legacy") as (gw, seen),
        Client(
            gw.url,
            mode="legacy",
            elicitation_callback=client_side.elicit,
            sampling_callback=client_side.sample,
        ) as client,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, f"rec__{tool}", arguments)
            with anyio.fail_after(BOUND):
                await client_side.asked.wait()
            tg.cancel_scope.cancel()
        await seen.wait_for(lambda ev: bool(cancels(ev)))  # the upstream was told
        with anyio.fail_after(BOUND):
            await client_side.withdrawn.wait()  # and so was the client


async def test_cancelling_ask_agent_withdraws_what_its_tool_calls_upstream_is_asking_the_client() -> None:
    """A run's tool calls are its request's: their questions are withdrawn with it."""
    model = ScriptedChatModel(script=[calls(call("rec__ask", question="name?"))])
    seen, client_side = Recorded(), Asked()
    async with serving_upstream(recorder.build(seen.memory.append)) as url:
        upstreams = {"rec": {"url": url, "protocol": "legacy"}}
        async with (
            running_gateway(
                {"upstreams": upstreams, "agent": {"memory": {"store": "memory"}}}, chat_model=model
            ) as gw,
            Client(gw.url, mode="legacy", elicitation_callback=client_side.elicit) as client,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "ask_agent", {"query": "ask me"})
                with anyio.fail_after(BOUND):
                    await client_side.asked.wait()
                tg.cancel_scope.cancel()
            await seen.wait_for(lambda ev: bool(cancels(ev)))
            with anyio.fail_after(BOUND):
                await client_side.withdrawn.wait()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_cancelled_subscribe_is_cancelled_upstream_under_its_own_id_and_holds_nothing(
    transport: str, tmp_path: Path
) -> None:
    async def subscribe(client: Client) -> None:
        with warnings.catch_warnings(action="ignore", category=MCPDeprecationWarning):
            await client.subscribe_resource("wait://30")  # the recorder answers after 30 s

    async with (
        recorded_gateway(transport, tmp_path, protocol="legacy") as (gw, seen),
        Client(gw.url, mode="legacy") as client,
    ):
        started: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe, client)
            started = (await seen.wait_for(lambda ev: any(e["event"] == "started" for e in ev)))[-1]
            tg.cancel_scope.cancel()
        events = await seen.wait_for(
            lambda ev: any(e["event"] == "handler_cancelled" for e in ev) and bool(cancels(ev))
        )
        held = gw.gateway.status()["subscriptions"]
    assert started["what"] == "subscribe"
    assert cancels(events) == [started["request_id"]]
    assert held == 0
