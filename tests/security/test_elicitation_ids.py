"""A URL-mode elicitation's id names one upstream's question to one client: the client sees an
id of the gateway's for it (two upstreams' ``auth-1`` are two ids), and the upstream's
``notifications/elicitation/complete`` for it reaches that client alone, whenever it comes.
Another upstream sending the same id, or the upstream sending it during another client's
call, closes nothing (``upstreams/elicitations.py``)."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse

from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.upstreams.elicitations import MAX_SHOWN
from tests.support import intercepted, running_gateway, serving

BOUND = 10.0


def signing_upstream(name: str, ids: list[str | list[str]]) -> Any:
    """FastMCP whose ``sign_in`` answers -32042 naming URL elicitations by the next of ``ids``
    (an id, or several) as the SDK's ``UrlElicitationRequiredError`` answers, and whose ``finish``,
    ``ask`` and ``spoof`` tools send completions: of the id given, as a server whose
    user finished in the browser tells its session (not related to any request of it)."""
    server = FastMCP(name)

    @server.tool
    def sign_in() -> str:
        return "never reached: intercepted"

    @server.tool
    async def finish(elicitation_id: str, ctx: Context) -> str:
        await ctx.session.send_elicit_complete(elicitation_id)
        return "told"

    @server.tool
    async def ask(elicitation_id: str, ctx: Context) -> str:
        """Ask by URL during the call, then say it is complete, both on the call's stream."""
        answer = await ctx.session.elicit_url(
            "Sign in", "https://example.com/auth", elicitation_id, related_request_id=ctx.request_id
        )
        await ctx.session.send_elicit_complete(elicitation_id, related_request_id=ctx.request_id)
        return answer.action

    async def intercept(scope: Any, message: dict[str, Any], send: Any) -> bool:
        if message.get("method") != "tools/call" or message["params"]["name"] != "sign_in":
            return False
        named = ids.pop(0)
        url = "https://example.com/a"
        elicitations = [
            {"mode": "url", "message": "Sign in", "url": url, "elicitationId": one}
            for one in ([named] if isinstance(named, str) else named)
        ]
        error = {"code": types.URL_ELICITATION_REQUIRED, "message": "URL elicitation required"}
        error["data"] = {"elicitations": elicitations}

        async def nothing() -> Any:
            return {"type": "http.request", "body": b""}

        await JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error})(scope, nothing, send)
        return True

    return intercepted(server, intercept)


class Heard:
    """What one client hears: completions by id, and the URL elicitations it was asked."""

    def __init__(self) -> None:
        self.completed: list[str] = []
        self.asked: list[str] = []
        self.news = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            self.completed.append(message.params.elicitation_id)
            self.news.set()

    async def on_elicitation(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params.elicitation_id)
        return types.ElicitResult(action="accept")

    def client(self, url: str) -> Client:
        return Client(
            url, mode="legacy", message_handler=self.on_message, elicitation_callback=self.on_elicitation
        )

    async def completion(self) -> str:
        with anyio.fail_after(BOUND):
            while not self.completed:
                self.news = anyio.Event()
                await self.news.wait()
        return self.completed.pop(0)


async def required(client: Client, tool: str) -> str:
    """The elicitation id in the -32042 answer to ``tool``."""
    return (await all_required(client, tool))[0]


async def all_required(client: Client, tool: str) -> list[str]:
    """The elicitation ids in the -32042 answer to ``tool``."""
    with anyio.fail_after(BOUND), pytest.raises(MCPError) as raised:
        await client.call_tool(tool, {})
    assert raised.value.error.code == types.URL_ELICITATION_REQUIRED
    return [e["elicitationId"] for e in raised.value.error.data["elicitations"]]


@asynccontextmanager
async def gateway_of(**upstreams: list[str | list[str]]) -> AsyncIterator[str]:
    """A gateway in front of one ``signing_upstream`` per name (shared handshake-era sessions)."""
    async with AsyncExitStack() as stack:
        config: dict[str, Any] = {"upstreams": {}}
        for name, ids in upstreams.items():
            base = await stack.enter_async_context(serving(signing_upstream(name, ids)))
            config["upstreams"][name] = {"url": f"{base}/mcp", "protocol": "legacy"}
        gateway = await stack.enter_async_context(running_gateway(config))
        yield gateway.url


async def test_another_upstream_cannot_complete_an_upstreams_url_elicitation() -> None:
    heard = Heard()
    async with gateway_of(a=["auth-1"], b=["auth-1"]) as url, heard.client(url) as client:
        of_a = await required(client, "a__sign_in")
        of_b = await required(client, "b__sign_in")  # the same id upstream: two ids here
        # b says a's id (and an id it never issued) is complete, during a call of this client.
        await client.call_tool("b__finish", {"elicitation_id": "auth-1"})
        assert await heard.completion() == of_b
        await client.call_tool("b__finish", {"elicitation_id": "never-issued"})
        await client.call_tool("b__finish", {"elicitation_id": of_a})  # what this client saw
        await client.call_tool("a__finish", {"elicitation_id": "auth-1"})
        assert await heard.completion() == of_a
    assert of_a != of_b
    assert heard.completed == []  # nothing but the two, once each


async def test_an_upstreams_completion_reaches_the_client_it_asked_not_the_one_calling() -> None:
    first, second = Heard(), Heard()
    async with (
        gateway_of(a=["auth-1"]) as url,
        first.client(url) as asked,
        second.client(url) as bystander,
    ):
        issued = await required(asked, "a__sign_in")
        # The first client's call has ended; the upstream tells its shared session the
        # elicitation is done while only the second client has a call in flight on it.
        await bystander.call_tool("a__finish", {"elicitation_id": "auth-1"})
        assert await first.completion() == issued
        await bystander.call_tool("a__finish", {"elicitation_id": "auth-1"})  # told once only
        await asked.call_tool("a__finish", {"elicitation_id": "auth-1"})
    assert second.completed == first.completed == []


async def test_a_url_elicitation_asked_during_a_call_is_completed_under_the_id_the_client_was_asked() -> None:
    heard = Heard()
    async with gateway_of(a=[], b=[]) as url, heard.client(url) as client:
        await client.call_tool("a__ask", {"elicitation_id": "e1"})
        await client.call_tool("b__ask", {"elicitation_id": "e1"})
        assert [await heard.completion(), await heard.completion()] == heard.asked
    assert len(set(heard.asked)) == 2
    assert "e1" not in heard.asked


async def test_a_client_is_told_of_its_latest_url_elicitations_of_an_upstream_only() -> None:
    heard = Heard()
    named = [f"e{n}" for n in range(MAX_SHOWN + 1)]
    async with gateway_of(a=[named]) as url, heard.client(url) as client:
        shown = await all_required(client, "a__sign_in")
        # Its first is forgotten (the bound), the last is not; told in the order sent.
        await client.call_tool("a__finish", {"elicitation_id": named[0]})
        await client.call_tool("a__finish", {"elicitation_id": named[-1]})
        assert await heard.completion() == shown[-1]
    assert len(set(shown)) == len(named)


async def test_url_elicitations_shown_to_sessions_are_forgotten_when_those_sessions_end() -> None:
    """Remembered for an hour after their session ended, each id held its client's request and
    session: a client opening sessions in a loop, each shown 64, held them all for that hour."""
    bystander = Heard()
    named = [f"e{n}" for n in range(MAX_SHOWN)]
    ids: list[str | list[str]] = ["kept", *[named] * 30]
    async with AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(serving(signing_upstream("a", ids)))
        config = {"upstreams": {"a": {"url": f"{upstream}/mcp", "protocol": "legacy"}}}
        running = await stack.enter_async_context(running_gateway(config))
        stays = await stack.enter_async_context(bystander.client(running.url))
        kept = await required(stays, "a__sign_in")
        for _ in range(30):
            async with Heard().client(running.url) as client:
                assert len(await all_required(client, "a__sign_in")) == MAX_SHOWN
        with anyio.fail_after(BOUND):
            while len(running.gateway.sessions.live) > 1:
                await anyio.sleep(0.01)
        await stays.call_tool("a__finish", {"elicitation_id": "kept"})  # the last call upstream
        assert await bystander.completion() == kept  # the bystander's is remembered still
        gc.collect()
        held = [o for o in gc.get_objects() if isinstance(o, DownstreamSession)]
        assert len(held) <= 5, len(held)  # the bystander's, and what timers not yet due hold


async def test_a_url_elicitation_remembered_holds_its_client_session_not_the_request_it_came_in() -> None:
    """Remembered for its completion, each id held the whole request it was shown in, the
    client's own ``_meta`` with it: 64 calls each with 1 MB of it held 64 MB for an hour."""
    heard = Heard()
    calls = 16
    async with gateway_of(a=[f"e{n}" for n in range(calls)]) as url, heard.client(url) as client:
        blob = {"com.example/blob": "x" * 60_000}
        for _ in range(calls):
            with anyio.fail_after(BOUND), pytest.raises(MCPError) as raised:
                await client.call_tool("a__sign_in", {}, meta=blob)  # pyright: ignore[reportArgumentType]
            assert raised.value.error.code == types.URL_ELICITATION_REQUIRED, raised.value.error
        await client.call_tool("a__finish", {"elicitation_id": "never-issued"})  # the last call
        gc.collect()
        held = [o for o in gc.get_objects() if isinstance(o, Caller) and o.client_meta]
        assert len(held) <= 4, len(held)  # what the last requests' contexts hold, not 16
        await client.call_tool("a__finish", {"elicitation_id": f"e{calls - 1}"})
        assert (await heard.completion()).startswith("gw-")  # its session is still told
