"""A static token rotated by a reload (its name kept, its secret changed): clients are keyed by
token name, so the old secret's session went on as the new one's client. Its open GET stream,
which no request checks again, was relayed every resource update and log line the new
secret's client was, after the reload that was meant to cut the leaked secret off."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from tests.faults.harness import text_of
from tests.security.test_policy_reload import BYSTANDER_TOKEN, CI_TOKEN, client
from tests.support import python_upstream
from tests.test_gateway import modern_request
from tests.test_proxying import Recorded
from tests.test_reload import from_file, write

ROTATED = "ci-token-rotated-fedcba9876543210"
LEGACY = "2025-11-25"
BOUND = 30.0
UPSTREAMS = {"rec": python_upstream("recorder.py", protocol="legacy")}


def _auth(ci_secret: str | None) -> dict[str, Any]:
    """The bystander's token, and ``ci``'s with ``ci_secret`` (None: taken out)."""
    tokens = [{"name": "bystander", "sha256": hashlib.sha256(BYSTANDER_TOKEN.encode()).hexdigest()}]
    if ci_secret is not None:
        tokens.append(
            {"name": "ci", "sha256": hashlib.sha256(ci_secret.encode()).hexdigest(), "policy": "ci"}
        )
    return {"mode": "bearer", "tokens": tokens, "policies": {"ci": {"resources": ["note://*"]}}}


def _rpc(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


@asynccontextmanager
async def _old_session(
    url: str, authorization: str = f"Bearer {CI_TOKEN}"
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """A session opened over bare HTTP with ``authorization`` (the secret about to be rotated),
    subscribed to ``note://x``; its client and the headers naming its session."""
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": LEGACY}
    async with httpx.AsyncClient(headers={"Authorization": authorization}, timeout=None) as http:
        hello = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
        answer = await http.post(url, json=_rpc(0, "initialize", hello), headers=headers)
        assert answer.status_code == 200
        headers["mcp-session-id"] = answer.headers["mcp-session-id"]
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        subscribed = await http.post(
            url, json=_rpc(1, "resources/subscribe", {"uri": "note://x"}), headers=headers
        )
        assert subscribed.status_code == 200
        yield http, headers


async def _read_stream(
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    seen: MemoryObjectSendStream[str],
    *,
    task_status: TaskStatus[None],
) -> None:
    """The old session's GET stream: "update" for each resource update relayed on it, then
    "end" when the gateway ends it (closed or cut)."""
    async with seen:
        try:
            async with http.stream("GET", url, headers={**headers, "accept": "text/event-stream"}) as stream:
                assert stream.status_code == 200
                task_status.started()
                async for line in stream.aiter_lines():
                    if "notifications/resources/updated" in line:
                        await seen.send("update")
        except httpx.HTTPError:  # cut rather than ended: ended all the same
            pass
        await seen.send("end")


async def test_a_token_a_reload_rotates_ends_the_old_secrets_session_while_the_new_secret_is_served(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "g.yaml", UPSTREAMS, auth=_auth(CI_TOKEN))
    relayed = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            relayed.set()

    send, seen = anyio.create_memory_object_stream[str](8)
    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, BYSTANDER_TOKEN) as bystander,
        _old_session(gw.url) as (old, headers),
        anyio.create_task_group() as tg,
        seen,
    ):
        await tg.start(_read_stream, old, gw.url, headers, send)
        await bystander.call_tool("rec__updates", {"uri": "note://x", "times": 1})
        with anyio.fail_after(BOUND):
            assert await seen.receive() == "update"  # the old stream is relayed, before

        write(path, UPSTREAMS, auth=_auth(ROTATED))
        assert await reloader.reload() is not None

        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        assert (await old.post(gw.url, json=ping, headers=headers)).status_code == 401
        async with client(gw.url, ROTATED, on_message) as rotated:
            with pytest.warns(MCPDeprecationWarning):
                await rotated.subscribe_resource("note://x")
            result = await bystander.call_tool("rec__updates", {"uri": "note://x", "times": 1})
            assert text_of(result) == "1"  # the bystander served throughout
            with anyio.fail_after(BOUND):
                await relayed.wait()  # the new secret's client is relayed the update
                assert await seen.receive() == "end"  # the old one's stream, none: it was ended


@asynccontextmanager
async def _modern(url: str, token: str) -> AsyncIterator[Client]:
    async with (
        # No read timeout (httpx2's is 5 s): a listen stream quiet that long ended by itself.
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=None) as http,
        Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as c,  # type: ignore[arg-type]
    ):
        yield c


async def _listen(c: Client, heard: MemoryObjectSendStream[str], *, task_status: TaskStatus[None]) -> None:
    """``c``'s listen stream: "changed" for each tools list change heard, then "end"."""
    async with heard, c.listen(tools_list_changed=True) as subscription:
        task_status.started()
        async for _ in subscription:
            await heard.send("changed")
        await heard.send("end")


async def test_a_token_a_reload_rotates_ends_the_old_secrets_listen_stream_while_the_new_ones_hears(
    tmp_path: Path,
) -> None:
    # A modern-era client's listen stream is a session while it is open: the old secret's went
    # on hearing every list change after the reload that rotated its token.
    path = write(tmp_path / "g.yaml", UPSTREAMS, auth=_auth(CI_TOKEN))
    old_sent, old_heard = anyio.create_memory_object_stream[str](8)
    new_sent, new_heard = anyio.create_memory_object_stream[str](8)
    async with (
        from_file(path) as (gw, reloader),
        _modern(gw.url, CI_TOKEN) as old,
        anyio.create_task_group() as tg,
        old_heard,
        new_heard,
    ):
        await tg.start(_listen, old, old_sent)
        write(path, UPSTREAMS, auth=_auth(ROTATED))
        assert await reloader.reload() is not None
        async with _modern(gw.url, ROTATED) as rotated:
            await tg.start(_listen, rotated, new_sent)
            write(path, {**UPSTREAMS, "more": python_upstream("counter.py")}, auth=_auth(ROTATED))
            assert await reloader.reload() is not None  # its tools listed: a list change told
            with anyio.fail_after(BOUND):
                assert await new_heard.receive() == "changed"  # the new secret's stream hears it
                assert await old_heard.receive() == "end"  # the old one's, nothing: it was ended
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("secret", [ROTATED, None], ids=["rotated", "removed"])
async def test_a_token_a_reload_rotates_or_takes_out_has_its_call_in_flight_cancelled_at_the_upstream(
    secret: str | None, tmp_path: Path
) -> None:
    # Rotated, its session is ended; taken out, the call is (before, it ran to its end).
    seen = Recorded(path=tmp_path / "recorder.jsonl")
    upstreams = {
        "rec": python_upstream("recorder.py", protocol="legacy", env={"RECORDER_LOG": str(seen.path)})
    }
    path = write(tmp_path / "g.yaml", upstreams, auth=_auth(CI_TOKEN))
    waiting = _rpc(2, "tools/call", {"name": "rec__wait", "arguments": {"seconds": 60}})
    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, BYSTANDER_TOKEN) as bystander,
        _old_session(gw.url) as (old, headers),
        anyio.create_task_group() as tg,
    ):

        async def call() -> None:
            with suppress(httpx.HTTPError):  # its stream cut
                await old.post(gw.url, json=waiting, headers=headers)

        tg.start_soon(call)
        await seen.wait_for(lambda events: any(e["event"] == "started" for e in events))
        write(path, upstreams, auth=_auth(secret))
        assert await reloader.reload() is not None
        await seen.wait_for(lambda events: any(e["event"] == "handler_cancelled" for e in events))
        assert text_of(await bystander.call_tool("rec__bump", {})) == "1"  # the bystander served
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("secret", "said"),
    [
        (ROTATED, "this request's token was given a new secret by a reload while it ran: use the new one"),
        (None, "this request's token was taken out by a reload while it ran"),
    ],
    ids=["rotated", "removed"],
)
async def test_a_token_a_reload_rotates_or_takes_out_ends_its_modern_call_in_flight_with_an_error_saying_so(
    secret: str | None, said: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A modern-era call is a request of its own, no session to end: before, the old secret's
    # call in flight ran to its end (its timeout) and was answered, after the reload that was
    # meant to cut the leaked secret off.
    seen = Recorded(path=tmp_path / "recorder.jsonl")
    upstreams = {
        "rec": python_upstream("recorder.py", protocol="legacy", env={"RECORDER_LOG": str(seen.path)})
    }
    path = write(tmp_path / "g.yaml", upstreams, auth=_auth(CI_TOKEN))
    ended: list[BaseException] = []
    async with (
        from_file(path) as (gw, reloader),
        client(gw.url, BYSTANDER_TOKEN) as bystander,
        _modern(gw.url, CI_TOKEN) as old,
        _modern(gw.url, BYSTANDER_TOKEN) as modern_bystander,
        anyio.create_task_group() as tg,
    ):

        async def call() -> None:
            try:
                await old.call_tool("rec__wait", {"seconds": 60})
            except MCPError as exc:
                ended.append(exc)

        tg.start_soon(call)
        await seen.wait_for(lambda events: any(e["event"] == "started" for e in events))
        waiting = {"bystander": anyio.Event()}

        async def bystanders_call() -> None:  # in flight through the reload, answered
            result = await modern_bystander.call_tool("rec__wait", {"seconds": 2})
            assert not result.is_error, result
            waiting["bystander"].set()

        tg.start_soon(bystanders_call)
        # In flight at the upstream as the reload runs, as the old secret's call is.
        await seen.wait_for(lambda events: sum(e["event"] == "started" for e in events) == 2)
        write(path, upstreams, auth=_auth(secret))
        assert await reloader.reload() is not None
        await seen.wait_for(lambda events: any(e["event"] == "handler_cancelled" for e in events))
        assert text_of(await bystander.call_tool("rec__bump", {})) == "1"  # the bystander served
        with anyio.fail_after(BOUND):
            await waiting["bystander"].wait()
            while not ended:
                await anyio.sleep(0.01)
    assert isinstance(error := ended[0], MCPError)
    assert (error.code, error.message) == (types.INVALID_REQUEST, said)
    warned = [r.getMessage() for r in caplog.records if "of rotated" in r.getMessage()]
    assert warned == [
        "reload: 1 requests of rotated or removed tokens being ended (ci): sent with a secret now refused"
    ]


async def test_a_rotated_tokens_request_whose_body_was_still_arriving_at_the_reload_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its credential was checked with its headers, before the reload; it began after it, so
    # no reload found it being served: before, it was served as the token's client.
    path = write(tmp_path / "g.yaml", UPSTREAMS, auth=_auth(CI_TOKEN))
    body, headers = modern_request("rec__bump", {}, authorization=f"Bearer {CI_TOKEN}")
    raw = json.dumps(body).encode()
    rest = anyio.Event()

    async def slowly() -> AsyncIterator[bytes]:
        yield raw[: len(raw) // 2]
        await rest.wait()
        yield raw[len(raw) // 2 :]

    answer: list[httpx.Response] = []
    async with from_file(path) as (gw, reloader), httpx.AsyncClient(timeout=BOUND) as http:
        async with anyio.create_task_group() as tg:

            async def post() -> None:
                answer.append(await http.post(gw.url, content=slowly(), headers=headers))

            tg.start_soon(post)
            with anyio.fail_after(BOUND):  # admitted: its headers' token checked
                while gw.gateway.access.client("ci") is None:
                    await anyio.sleep(0.01)
            write(path, UPSTREAMS, auth=_auth(ROTATED))
            assert await reloader.reload() is not None
            rest.set()
        async with client(gw.url, BYSTANDER_TOKEN) as bystander:
            assert text_of(await bystander.call_tool("rec__bump", {})) == "1"  # the old one's never ran
    error = answer[0].json()["error"]
    assert (error["code"], error["message"]) == (
        types.INVALID_REQUEST,
        "this request's token was given a new secret by a reload before it began: use the new one",
    )
    said = "request of rotated token ci refused as it began: admitted before a reload"
    assert [r.getMessage() for r in caplog.records if "refused as it began" in r.getMessage()] == [said]


async def _unasked(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("a modern client is asked by its call's result, not a request")


async def test_a_token_a_reload_rotates_has_the_calls_held_for_its_answers_given_up_upstream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A modern client's call held between rounds for a handshake-era upstream's question runs
    # in a task of the gateway's own, no request: before, it lived on for the question's 300 s,
    # its upstream call and a place of its client's bound held, though only the old secret's
    # holder had its requestState, and that secret was now refused.
    caplog.set_level(logging.INFO, "agent_gateway.downstream.held_calls")
    seen = Recorded(path=tmp_path / "recorder.jsonl")
    upstreams = {
        "rec": python_upstream("recorder.py", protocol="legacy", env={"RECORDER_LOG": str(seen.path)})
    }
    path = write(tmp_path / "g.yaml", upstreams, auth=_auth(CI_TOKEN))
    async with (
        from_file(path) as (gw, reloader),
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {CI_TOKEN}"}, timeout=BOUND) as http,
        Client(
            streamable_http_client(gw.url, http_client=http),  # type: ignore[arg-type]
            mode="auto",
            elicitation_callback=_unasked,
        ) as old,
    ):
        first = await old.session.call_tool("rec__ask", {"question": "name?"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)  # held, its question sent back
        await seen.wait_for(lambda events: any(e["event"] == "asking" for e in events))
        write(path, upstreams, auth=_auth(ROTATED))
        assert await reloader.reload() is not None
        await seen.wait_for(lambda events: any(e["event"] == "handler_cancelled" for e in events))
    assert any("given up: its token was withdrawn" in r.getMessage() for r in caplog.records)
