"""server-everything's requests to its client, its log lines and its resource updates, carried
through the gateway to the official client and answered by it: each test looks at what
server-everything reports back, so the far end saw what the client said.
"""

from __future__ import annotations

import base64
import gzip
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
import pytest
import pytest_asyncio
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import FileUrl

from agent_gateway.downstream.sessions import LEVELS
from tests.e2e.peers import BOUND, MODES, PROTOCOL_OF_MODE, gateway_url, text_of
from tests.support import npm_server

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DOCUMENT = "demo://resource/static/document/architecture.md"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_url() -> AsyncIterator[str]:
    """A gateway whose clients share one server-everything session (the default)."""
    async with gateway_url({"everything": npm_server("server-everything", "stdio")}) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def per_client_url() -> AsyncIterator[str]:
    """A gateway giving each client its own server-everything process (``session: per_client``)."""
    upstream = {**npm_server("server-everything", "stdio"), "session": "per_client"}
    async with gateway_url({"everything": upstream}) as url:
        yield url


async def test_a_sampling_request_is_answered_by_the_calling_clients_model(shared_url: str) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="forty-two"),
            model="client-model-7",
        )

    with anyio.fail_after(BOUND):
        async with Client(shared_url, mode="legacy", sampling_callback=model) as client:
            result = await client.call_tool(
                "everything__trigger-sampling-request", {"prompt": "the answer?", "maxTokens": 12}
            )
    assert not result.is_error, text_of(result)
    assert len(asked) == 1
    assert asked[0].system_prompt == "You are a helpful test server."
    assert asked[0].max_tokens == 12
    assert asked[0].messages[0].content == types.TextContent(
        type="text", text="Resource trigger-sampling-request context: the answer?"
    )
    # server-everything quotes the result it got back: our client's answer, unchanged.
    assert '"text": "forty-two"' in text_of(result)
    assert '"model": "client-model-7"' in text_of(result)


@pytest.mark.parametrize("action", ["accept", "decline"])
async def test_an_elicitation_is_answered_by_the_calling_client(shared_url: str, action: str) -> None:
    shown: list[types.ElicitRequestParams] = []

    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        shown.append(params)
        if action == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"name": "Ada Lovelace", "integer": 7})

    with anyio.fail_after(BOUND):
        async with Client(shared_url, mode="legacy", elicitation_callback=user) as client:
            result = await client.call_tool("everything__trigger-elicitation-request", {})
    assert not result.is_error, text_of(result)
    assert len(shown) == 1
    assert isinstance(shown[0], types.ElicitRequestFormParams)
    assert shown[0].requested_schema["required"] == ["name"]
    if action == "accept":
        assert "- Name: Ada Lovelace" in text_of(result)
        assert "- Favorite Integer: 7" in text_of(result)
    else:
        assert "User declined" in text_of(result)


async def test_a_modern_client_answers_a_handshake_era_upstreams_request_in_rounds(
    shared_url: str,
) -> None:
    """server-everything asks in the middle of its call and waits; the modern client is asked
    by an InputRequiredResult, and its retry's answer reaches the waiting upstream."""
    asked: list[types.CreateMessageRequestParams] = []

    async def model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        reply = types.TextContent(type="text", text="a modern model's answer")
        return types.CreateMessageResult(role="assistant", content=reply, model="scripted")

    with anyio.fail_after(BOUND):
        async with Client(shared_url, mode="auto", sampling_callback=model) as client:
            result = await client.call_tool("everything__trigger-sampling-request", {"prompt": "hi"})
    assert not result.is_error, text_of(result)
    assert len(asked) == 1
    assert "a modern model's answer" in text_of(result)


async def test_a_client_without_sampling_gets_a_clear_error_not_a_hang(shared_url: str) -> None:
    with anyio.fail_after(BOUND):
        async with Client(shared_url, mode="legacy") as client:
            result = await client.call_tool("everything__trigger-sampling-request", {"prompt": "hi"})
    assert result.is_error
    assert "did not declare the capability for sampling/createMessage" in text_of(result)


async def test_the_upstream_sees_each_clients_own_roots_and_their_changes(per_client_url: str) -> None:
    roots = {"ada": ["file:///work/ada"], "bob": ["file:///work/bob"]}
    asked = {"ada": 0, "bob": 0}

    def roots_of(who: str) -> Any:
        async def listed(context: Any) -> types.ListRootsResult:
            asked[who] += 1
            return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri), name=who) for uri in roots[who]])

        return listed

    with anyio.fail_after(BOUND * 2):
        async with (
            Client(per_client_url, mode="legacy", list_roots_callback=roots_of("ada")) as ada,
            Client(per_client_url, mode="legacy", list_roots_callback=roots_of("bob")) as bob,
        ):
            first_ada = text_of(await ada.call_tool("everything__get-roots-list", {}))
            first_bob = text_of(await bob.call_tool("everything__get-roots-list", {}))
            roots["ada"] = ["file:///work/ada-2", "file:///work/shared"]
            before = dict(asked)
            await ada.session.send_notification(types.RootsListChangedNotification())
            # server-everything asks for the roots again when told they changed.
            while asked["ada"] == before["ada"]:
                await anyio.sleep(0.02)
            second_ada = text_of(await ada.call_tool("everything__get-roots-list", {}))
            # A round trip on bob's own upstream session: had it been told, it would have asked.
            second_bob = text_of(await bob.call_tool("everything__get-roots-list", {}))
    assert "URI: file:///work/ada" in first_ada
    assert "URI: file:///work/bob" in first_bob
    assert "file:///work/ada" not in first_bob
    assert "Current MCP Roots (2 total)" in second_ada
    assert "URI: file:///work/ada-2" in second_ada
    assert "URI: file:///work/shared" in second_ada
    assert asked["bob"] == before["bob"]  # bob's roots did not change: its session was not told
    assert second_bob == first_bob


def simulated(
    lines: list[types.LoggingMessageNotificationParams],
) -> list[types.LoggingMessageNotificationParams]:
    """The simulated lines among ``lines`` ("Debug-level message" … "Alert level-message"):
    server-everything also says, whenever it has asked the gateway for its roots, "Roots
    updated" (logger ``everything-server``), at no set time."""
    return [line for line in lines if re.match(r"\w+[- ]level[- ]message", str(line.data))]


async def test_simulated_log_lines_reach_every_client_tagged_with_the_upstream(shared_url: str) -> None:
    lines: dict[str, list[types.LoggingMessageNotificationParams]] = {"caller": [], "bystander": []}

    def collect(who: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            lines[who].append(params)

        return on_log

    with anyio.fail_after(BOUND):
        async with (
            Client(shared_url, mode="legacy", logging_callback=collect("caller")) as client,
            Client(shared_url, mode="legacy", logging_callback=collect("bystander")),
        ):
            started = await client.call_tool("everything__toggle-simulated-logging", {})
            # The first line comes during the call (the caller's); the next, 5 s on, outside
            # any call: no call owns it, so every handshake-era client gets it.
            while not simulated(lines["bystander"]):
                await anyio.sleep(0.02)
            stopped = await client.call_tool("everything__toggle-simulated-logging", {})
    assert "Started simulated" in text_of(started)
    assert "Stopped simulated" in text_of(stopped)
    assert len(simulated(lines["caller"])) >= 2
    # server-everything sends "<Level>-level message" lines at random levels, with no logger.
    for line in (simulated(lines["caller"])[0], simulated(lines["bystander"])[0]):
        assert line.logger == "everything"
        assert line.level in LEVELS
        assert f"{line.level.capitalize()}" in str(line.data)


@pytest.mark.parametrize("mode", MODES)
async def test_resource_updates_reach_the_subscribed_client(shared_url: str, mode: str) -> None:
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if mode == "legacy" and isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    with anyio.fail_after(BOUND):
        async with Client(shared_url, mode=mode, message_handler=on_message) as client:
            assert client.protocol_version == PROTOCOL_OF_MODE[mode]
            if mode == "legacy":
                with pytest.warns(MCPDeprecationWarning):
                    await client.subscribe_resource(DOCUMENT)
                await _toggle_updates(client)
                while not updates:
                    await anyio.sleep(0.02)
                await _toggle_updates(client)
                with pytest.warns(MCPDeprecationWarning):
                    await client.unsubscribe_resource(DOCUMENT)
            else:
                async with client.listen(resource_subscriptions=[DOCUMENT]) as subscription:
                    await _toggle_updates(client)
                    async for event in subscription:
                        updates.append(event.uri)  # type: ignore[union-attr]
                        break
                await _toggle_updates(client)
    assert updates == [DOCUMENT]


async def _toggle_updates(client: Client) -> None:
    result = await client.call_tool("everything__toggle-subscriber-updates", {})
    assert not result.is_error, text_of(result)


async def gzipped_and_read(url: str, mode: str, name: str) -> tuple[str, bytes]:
    """server-everything's ``gzip-file-as-resource`` run on a data URI: the link it returns
    (to a resource it makes for this session, which it has not listed when the result comes
    back), and the bytes read through it, unzipped."""
    data = "data:text/plain;base64," + base64.b64encode(b"hello through a link").decode()
    with anyio.fail_after(BOUND):
        async with Client(url, mode=mode) as client:
            result = await client.call_tool("everything__gzip-file-as-resource", {"name": name, "data": data})
            link = next(block for block in result.content if isinstance(block, types.ResourceLink))
            read = await client.read_resource(link.uri)
    blob = read.contents[0]
    assert isinstance(blob, types.BlobResourceContents), read
    return link.uri, gzip.decompress(base64.b64decode(blob.blob))


@pytest.mark.parametrize("mode", MODES)
async def test_a_file_a_tool_made_is_read_through_the_link_it_returned(shared_url: str, mode: str) -> None:
    # Before: "Resource not found" (the catalog listed the file only once the upstream's
    # list_changed was handled, after the client had its result).
    uri, unzipped = await gzipped_and_read(shared_url, mode, f"shared-{mode}.gz")
    assert uri.endswith(f"demo://resource/session/shared-{mode}.gz")
    assert unzipped == b"hello through a link"


async def test_a_file_made_in_a_clients_own_session_is_read_through_its_link(per_client_url: str) -> None:
    # Before: "Resource not found" for ever (the catalog lists the shared session's resources).
    uri, unzipped = await gzipped_and_read(per_client_url, "legacy", "own.gz")
    assert uri == "everything+demo://resource/session/own.gz"
    assert unzipped == b"hello through a link"
