"""What happens during a call crosses the gateway intact: session ids, cancellation, progress.

Each test observes the effect at the far end, in a recording upstream reached over stdio
and over Streamable HTTP, with the official client downstream in both eras.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from pydantic import FileUrl

from tests.servers import recorder
from tests.support import RunningGateway, python_upstream, running_gateway, serving_upstream

MODES = ["legacy", "auto"]
TRANSPORTS = ["stdio", "http"]
# Each upstream transport in each era: how a cancel reaches it differs by era on HTTP.
UPSTREAMS = [("stdio", "legacy"), ("stdio", "auto"), ("http", "legacy"), ("http", "auto")]
BOUND = 10.0


@dataclass
class Recorded:
    """What the recording upstream has seen, from memory (HTTP) or its log file (stdio)."""

    memory: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None

    def all(self) -> list[dict[str, Any]]:
        if self.path is None:
            return list(self.memory)
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.all() if e["event"] == event]

    async def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        with anyio.fail_after(BOUND):
            while not predicate(events := self.all()):
                await anyio.sleep(0.01)
        return events


@asynccontextmanager
async def recorded_gateway(
    transport: str, tmp_path: Path, **extra: Any
) -> AsyncIterator[tuple[RunningGateway, Recorded]]:
    if transport == "stdio":
        seen = Recorded(path=tmp_path / "recorder.jsonl")
        upstream = python_upstream("recorder.py", env={"RECORDER_LOG": str(seen.path)}, **extra)
        async with running_gateway({"upstreams": {"rec": upstream}}) as gw:
            yield gw, seen
        return
    seen = Recorded()
    async with (
        serving_upstream(recorder.build(seen.memory.append)) as url,
        running_gateway({"upstreams": {"rec": {"url": url, **extra}}}) as gw,
    ):
        yield gw, seen


def cancels(events: list[dict[str, Any]]) -> list[str]:
    return [
        str(e["params"]["requestId"])
        for e in events
        if e["event"] == "notification" and e["method"] == "notifications/cancelled"
    ]


async def cancelled_once_started(
    request: Callable[[], Coroutine[Any, Any, Any]], seen: Recorded, transport: str, protocol: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``request`` cancelled once the recording upstream has started on it: the upstream's
    ``started`` record, and its records once the cancel has reached it."""
    started: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(request)
        started = (await seen.wait_for(lambda ev: any(e["event"] == "started" for e in ev)))[-1]
        tg.cancel_scope.cancel()
    # A modern HTTP upstream is cancelled by closing the request's stream, not by a notification.
    modern_http = transport == "http" and protocol != "legacy"
    # Both recorded, in either order: the SDK cancels the handler as the notification comes
    # in, and the notification's own record is made on its way to the server's handlers.
    events = await seen.wait_for(
        lambda ev: any(e["event"] == "handler_cancelled" for e in ev) and (modern_http or bool(cancels(ev)))
    )
    return started, events


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_call_is_cancelled_upstream_under_the_upstreams_own_id(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, seen),
        Client(gw.url, mode=mode) as client,
    ):
        started, events = await cancelled_once_started(
            lambda: client.call_tool("rec__wait", {"seconds": 30}), seen, transport, protocol
        )
    modern_http = transport == "http" and protocol != "legacy"
    upstream_id = started["request_id"]
    assert [e["request_id"] for e in events if e["event"] == "handler_cancelled"] == [upstream_id]
    assert cancels(events) == ([] if modern_http else [upstream_id])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_call_that_times_out_is_cancelled_upstream(transport: str, tmp_path: Path) -> None:
    async with (
        recorded_gateway(transport, tmp_path, timeout=3, protocol="legacy") as (gw, seen),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await client.call_tool("rec__wait", {"seconds": 30})
        events = await seen.wait_for(lambda ev: bool(cancels(ev)))
    assert result.is_error
    assert "no answer within 3s" in str(result.content[0])
    started = [e["request_id"] for e in events if e["event"] == "started"]
    assert cancels(events) == started


SESSION_KEY = "io.agent-gateway/session-id"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_each_downstream_session_has_its_own_id_sent_upstream_in_meta(
    transport: str, tmp_path: Path
) -> None:
    async with recorded_gateway(transport, tmp_path) as (gw, _):
        seen: dict[str, set[str]] = {}

        async def one_client(n: int) -> None:
            async with Client(gw.url, mode="legacy") as client:
                for _ in range(3):
                    result = await client.call_tool("rec__whoami", {})
                    assert result.structured_content is not None
                    seen.setdefault(f"client{n}", set()).add(result.structured_content["meta"][SESSION_KEY])

        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(one_client, n)
    ids = [ids for ids in seen.values()]
    assert all(len(one) == 1 for one in ids)  # stable within a session
    assert len(set().union(*ids)) == 4  # distinct between sessions


async def test_a_modern_request_carries_a_session_id_of_its_own(tmp_path: Path) -> None:
    async with recorded_gateway("http", tmp_path) as (gw, _), Client(gw.url, mode="auto") as client:
        first = (await client.call_tool("rec__whoami", {})).structured_content
        second = (await client.call_tool("rec__whoami", {})).structured_content
    assert first is not None
    assert second is not None
    assert first["meta"][SESSION_KEY] != second["meta"][SESSION_KEY]


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_progress_reaches_the_client_under_its_own_token_in_order(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, _),
        Client(gw.url, mode=mode) as client,
    ):
        result = await client.call_tool("rec__steps", {"count": 5}, progress_callback=on_progress)
        with anyio.fail_after(BOUND):
            while len(received) < 5:
                await anyio.sleep(0.01)
    assert not result.is_error
    assert received == [(float(n), 5.0, f"step {n}") for n in range(1, 6)]


ASKER_KEY = "io.agent-gateway/upstream"


def asker(context: Any) -> str:
    """Who the gateway says is asking, in the question's ``_meta`` (``upstreams/asking.py``)."""
    return str((context.meta or {}).get(ASKER_KEY))


async def sampled(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    prompt = params.messages[0].content
    text = prompt.text if isinstance(prompt, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=f"model says: {text} (asked by {asker(context)})"),
        model="test-model",
    )


async def elicited(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(
        action="accept", content={"value": f"answer to {params.message} ({asker(context)})"}
    )


async def rooted(context: Any) -> types.ListRootsResult:
    uri = FileUrl(f"file:///work/project-for-{asker(context)}")
    return types.ListRootsResult(roots=[types.Root(uri=uri, name="project")])


def answering_client(url: str, mode: str) -> Client:
    return Client(
        url, mode=mode, sampling_callback=sampled, elicitation_callback=elicited, list_roots_callback=rooted
    )


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_sampling_elicitation_and_roots_are_answered_by_the_calling_client(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, _),
        answering_client(gw.url, mode) as client,
    ):
        sample = await client.call_tool("rec__sample", {"prompt": "hi"})
        ask = await client.call_tool("rec__ask", {"question": "name?"})
        roots = await client.call_tool("rec__roots", {})
    # A modern client asked by a handshake-era upstream answers in rounds: the call is held
    # across them (downstream/held_calls.py), and the mcp client sends its answers back.
    assert not sample.is_error, sample.content
    # Each question names the upstream asking: in a form's message, which the client shows its
    # user, and in its _meta (2026-07-28 defines no _meta on the sampling and elicitation
    # requests of an InputRequiredResult, so a modern client's have none). The model's
    # messages stay as they came.
    named = "rec" if mode == "legacy" else "None"
    assert sample.content[0] == types.TextContent(type="text", text=f"model says: hi (asked by {named})")
    assert ask.content[0] == types.TextContent(type="text", text=f"accept:answer to [rec] name? ({named})")
    assert roots.structured_content == {"result": ["file:///work/project-for-rec"]}


@dataclass
class Answering:
    """A client that answers sampling, elicitation and roots under its own name, and keeps
    what it was asked and the log lines it got."""

    name: str
    asked: list[str] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)

    def client(self, url: str) -> Client:
        async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            self.asked.append("sampling")
            text = f"{self.name}'s model"
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=text), model="m"
            )

        async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            self.asked.append("elicitation")
            return types.ElicitResult(action="accept", content={"value": self.name})

        async def roots(context: Any) -> types.ListRootsResult:
            self.asked.append("roots")
            return types.ListRootsResult(roots=[types.Root(uri=FileUrl(f"file:///{self.name}"))])

        async def log(params: types.LoggingMessageNotificationParams) -> None:
            self.logged.append(params.data["msg"])

        return Client(
            url,
            mode="legacy",
            sampling_callback=sample,
            elicitation_callback=elicit,
            list_roots_callback=roots,
            logging_callback=log,
        )


REFUSED = "refused"
# (transport, upstream era) of a shared upstream session -> who answers B's sampling,
# elicitation and roots requests, and who gets B's log line. The mcp client names the caller
# for requests on a call's own HTTP stream and for a modern upstream's input requests; a
# stdio session with two clients' calls in flight cannot say whose a request is, so it is
# refused (and a log line dropped). The recorder asks for roots on the session's own
# channel, not the call's: with a handshake-era HTTP upstream that is the ambiguous case too.
ATTRIBUTION: dict[tuple[str, str], tuple[str, str, str, str | None]] = {
    ("http", "legacy"): ("b", "b", REFUSED, "b"),
    ("http", "auto"): ("b", "b", "b", "b"),
    ("stdio", "legacy"): (REFUSED, REFUSED, REFUSED, None),
}


@pytest.mark.parametrize(("transport", "protocol"), list(ATTRIBUTION))
async def test_upstream_requests_and_log_lines_go_to_the_client_whose_call_caused_them(
    transport: str, protocol: str, tmp_path: Path
) -> None:
    a, b = Answering("a"), Answering("b")
    results: list[types.CallToolResult] = []
    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, seen),
        a.client(gw.url) as client_a,
        b.client(gw.url) as client_b,
        anyio.create_task_group() as tg,
    ):
        # A's call is in flight on the same upstream session while B's calls ask their questions.
        tg.start_soon(client_a.call_tool, "rec__wait", {"seconds": 30})
        await seen.wait_for(lambda ev: any(e["event"] == "started" for e in ev))
        results.append(await client_b.call_tool("rec__sample", {"prompt": "hi"}))
        results.append(await client_b.call_tool("rec__ask", {"question": "name?"}))
        results.append(await client_b.call_tool("rec__roots", {}))
        await client_b.call_tool("rec__say", {"text": "for b", "level": "warning"})
        await client_b.call_tool("rec__whoami", {})  # B's log line is in before this answer
        tg.cancel_scope.cancel()
    *answered_by, logged_to = ATTRIBUTION[(transport, protocol)]
    answers = {"sampling": "b's model", "elicitation": "accept:b", "roots": '["file:///b"]'}
    assert (a.asked, a.logged) == ([], [])
    for (what, answer), result, by in zip(answers.items(), results, answered_by, strict=True):
        shown = text_of(result)
        if by == REFUSED:
            assert result.is_error, (what, shown)
            assert "several clients have calls in flight" in shown, what
        else:
            assert (result.is_error, shown) == (False, answer), what
    assert b.asked == [what for what, by in zip(answers, answered_by, strict=True) if by == "b"]
    assert b.logged == (["for b"] if logged_to == "b" else [])


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_client_without_the_capability_gets_a_clear_error_not_a_hang(
    transport: str, tmp_path: Path
) -> None:
    async with (
        recorded_gateway(transport, tmp_path, protocol="legacy") as (gw, _),
        Client(gw.url, mode="legacy") as client,
    ):
        with anyio.fail_after(BOUND):
            result = await client.call_tool("rec__sample", {"prompt": "hi"})
    assert result.is_error
    assert "did not declare the capability for sampling/createMessage" in str(result.content[0])


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_upstream_log_lines_reach_the_calling_client_tagged_with_the_upstream(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    lines: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(params)

    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, _),
        # A modern client opts in per request; a handshake-era one gets lines by default.
        Client(gw.url, mode=mode, logging_callback=on_log, log_level="debug") as client,
    ):
        await client.call_tool("rec__say", {"text": "hello", "level": "warning"})
        with anyio.fail_after(BOUND):
            while not lines:
                await anyio.sleep(0.01)
    # FastMCP's ctx.log sends {"msg": ..., "extra": ...}; the gateway passes data through as is.
    assert [(line.level, line.data["msg"], line.logger) for line in lines] == [("warning", "hello", "rec")]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_set_level_is_applied_upstream_and_filters_what_the_client_gets(
    transport: str, tmp_path: Path
) -> None:
    lines: dict[str, list[str]] = {"quiet": [], "verbose": []}

    def collect(who: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            lines[who].append(params.data["msg"])

        return on_log

    async with (
        recorded_gateway(transport, tmp_path, protocol="legacy") as (gw, seen),
        Client(gw.url, mode="legacy", logging_callback=collect("verbose")) as verbose,
        Client(gw.url, mode="legacy", logging_callback=collect("quiet")) as quiet,
    ):
        # The verbose client's level holds the shared upstream at debug, so the upstream
        # sends the quiet client's info line too: only the gateway's filter can hold it back.
        levels: list[tuple[Client, types.LoggingLevel]] = [(verbose, "debug"), (quiet, "error")]
        for client, level in levels:
            with pytest.warns(MCPDeprecationWarning) as warned:
                await client.set_logging_level(level)
            assert not [w for w in warned if "agent_gateway" in w.filename]  # only the client warns
        await seen.wait_for(lambda ev: any(e["event"] == "set_level" for e in ev))
        await verbose.call_tool("rec__say", {"text": "sent at info", "level": "info"})
        await quiet.call_tool("rec__say", {"text": "quiet", "level": "info"})
        await quiet.call_tool("rec__say", {"text": "loud", "level": "error"})
        with anyio.fail_after(BOUND):
            while not (lines["quiet"] and lines["verbose"]):
                await anyio.sleep(0.01)
    # A shared session runs at the most verbose level any client asked for, told it once.
    assert [e["level"] for e in seen.of("set_level")] == ["debug"]
    assert lines == {"verbose": ["sent at info"], "quiet": ["loud"]}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_one_clients_quiet_level_holds_back_no_other_clients_lines_and_leaves_with_it(
    transport: str, tmp_path: Path
) -> None:
    lines: dict[str, list[str]] = {"before": [], "beside": [], "after": []}

    def collect(who: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            lines[who].append(params.data["msg"])

        return on_log

    async def said(who: str, client: Client) -> None:
        await client.call_tool("rec__say", {"text": "info-line", "level": "info"})
        await client.call_tool("rec__say", {"text": "end", "level": "error"})
        with anyio.fail_after(BOUND):
            while "end" not in lines[who]:
                await anyio.sleep(0.01)

    async def told(count: int) -> None:
        # The upstream is told a level once the clients change, not before the change is
        # answered: a line said before it is told would be held back at the old level.
        await seen.wait_for(lambda events: len([e for e in events if e["event"] == "set_level"]) == count)

    async with recorded_gateway(transport, tmp_path, protocol="legacy") as (gw, seen):
        async with Client(gw.url, mode="legacy") as quiet:
            with pytest.warns(MCPDeprecationWarning):
                await quiet.set_logging_level("error")  # alone: the upstream is told error
            async with Client(gw.url, mode="legacy", logging_callback=collect("beside")) as beside:
                await told(2)
                await said("beside", beside)  # asked for no level: every line, as before
        async with Client(gw.url, mode="legacy", logging_callback=collect("after")) as after:
            await told(4)
            await said("after", after)
    assert lines["beside"] == ["info-line", "end"]
    assert lines["after"] == ["info-line", "end"]
    # error while the quiet client is alone, the default's nearest while another is there,
    # and again once it has left the quiet one alone, then gone with it.
    assert [e["level"] for e in seen.of("set_level")] == ["error", "debug", "error", "debug"]


class _HeldLevel:
    """Answers ``logging/setLevel`` to ``level`` once ``release`` is set, from its second on."""

    def __init__(self, level: str, release: anyio.Event) -> None:
        self._level, self._release, self._seen = level, release, 0

    async def __call__(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}  # the raw wire params
        if ctx.method == "logging/setLevel" and params.get("level") == self._level:
            self._seen += 1
            if self._seen > 1:
                await self._release.wait()
        return await call_next(ctx)


async def test_a_client_leaving_while_anothers_leaving_is_still_being_told_upstream_sets_the_level_of_those_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before, each change was decided from the level the upstream had last answered for: the
    # quiet client, leaving while the `error` its neighbour's leaving asked for was still on its
    # way, saw `debug` in place and sent nothing. The upstream then stayed at `error` with no
    # client asking for it, every later client's info lines lost (a full run's flaky failure).
    caplog.set_level(logging.INFO, "agent_gateway.downstream.sessions")
    seen = Recorded()
    release, leave = anyio.Event(), anyio.Event()
    server = recorder.build(seen.memory.append)
    server.add_middleware(_HeldLevel("error", release))

    def levels() -> list[str]:
        return [e["level"] for e in seen.of("set_level")]

    def ended() -> int:
        return sum(" ended after " in r.getMessage() for r in caplog.records)

    async def quiet_client() -> None:
        async with Client(gw.url, mode="legacy") as quiet:
            with pytest.warns(MCPDeprecationWarning):
                await quiet.set_logging_level("error")
            await leave.wait()

    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}) as gw,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(quiet_client)
        await seen.wait_for(lambda _: levels() == ["error"])
        async with Client(gw.url, mode="legacy"):
            await seen.wait_for(lambda _: levels() == ["error", "debug"])
        await seen.wait_for(lambda _: levels() == ["error", "debug", "error"])  # held upstream
        leave.set()
        with anyio.fail_after(BOUND):  # the quiet client's leaving decided (logged just before)
            while ended() < 2:
                await anyio.sleep(0.01)
        release.set()
        await seen.wait_for(lambda _: levels() == ["error", "debug", "error", "debug"])


class _RefusedOnce:
    """Refuses the first ``logging/setLevel`` it is sent (a moment's fault upstream)."""

    def __init__(self) -> None:
        self._refused = False

    async def __call__(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "logging/setLevel" and not self._refused:
            self._refused = True
            raise MCPError(types.INTERNAL_ERROR, "not now")
        return await call_next(ctx)


async def test_a_level_the_upstream_refused_is_sent_again_at_the_next_change() -> None:
    # A level the upstream did not take is not the one it runs at: the next change decides
    # from the level it holds, so the client asking again is heard (before, as the level asked,
    # it would have been taken as applied and never sent again).
    seen = Recorded()
    server = recorder.build(seen.memory.append)
    server.add_middleware(_RefusedOnce())
    async with (
        serving_upstream(server) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy") as client,
    ):
        for _ in range(2):  # refused upstream the first time: a warning, not the client's error
            with pytest.warns(MCPDeprecationWarning):
                await client.set_logging_level("error")
        await seen.wait_for(
            lambda events: [e["level"] for e in events if e["event"] == "set_level"] == ["error"] * 2
        )


async def test_a_reconnected_upstream_is_told_the_level_its_clients_asked_for(tmp_path: Path) -> None:
    async with (
        recorded_gateway("stdio", tmp_path, protocol="legacy") as (gw, seen),
        Client(gw.url, mode="legacy") as client,
    ):
        with pytest.warns(MCPDeprecationWarning):
            await client.set_logging_level("error")
        await seen.wait_for(lambda ev: any(e["event"] == "set_level" for e in ev))
        upstream = gw.gateway.pool.get("rec")
        upstream.session().lose("the test drops the connection")  # a new process comes up
        with anyio.fail_after(BOUND):
            while upstream.connections < 2 or upstream.state != "up":
                await anyio.sleep(0.02)
        # Before: the new process ran at its default level, sending the client every line.
        await seen.wait_for(lambda ev: sum(e["event"] == "set_level" for e in ev) == 2)
        levels = [e["level"] for e in seen.of("set_level")]
    assert levels == ["error", "error"]


async def status(gw: RunningGateway) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{gw.base}/status")).json()


async def settled(gw: RunningGateway, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    with anyio.fail_after(BOUND):
        while not predicate(now := await status(gw)):
            await anyio.sleep(0.02)
    return now


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_per_client_upstreams_get_a_session_per_client_closed_when_it_ends(
    transport: str, tmp_path: Path
) -> None:
    async with recorded_gateway(transport, tmp_path, session="per_client", protocol="legacy") as (gw, _):
        before = await status(gw)
        async with Client(gw.url, mode="legacy") as a, Client(gw.url, mode="legacy") as b:
            seen_a = [(await a.call_tool("rec__whoami", {})).structured_content for _ in range(2)]
            seen_b = (await b.call_tool("rec__whoami", {})).structured_content
            # /status is at most a second old (http.PAGE_INTERVAL): read until it shows both.
            during = await settled(gw, lambda s: s["upstream_sessions"]["dedicated"] == 2)
        after = await settled(gw, lambda s: s["upstream_sessions"]["dedicated"] == 0)
    assert seen_a[0] is not None
    assert seen_a[1] is not None
    assert seen_b is not None
    who = "pid" if transport == "stdio" else "session"
    assert seen_a[0][who] == seen_a[1][who] != seen_b[who]
    assert during["upstream_sessions"]["dedicated"] == 2
    assert during["sessions"]["live"] == 2
    assert after["sessions"]["live"] == 0
    if transport == "stdio":  # a dedicated stdio session is a process: started, then gone
        assert during["child_processes"] == before["child_processes"] + 2
        assert after["child_processes"] == before["child_processes"]


async def test_concurrent_clients_never_see_each_others_state(tmp_path: Path) -> None:
    rounds = 10

    # A stateful upstream: handshake era, where the upstream's session is the state's key.
    async with recorded_gateway("http", tmp_path, session="per_client", protocol="legacy") as (gw, _):
        totals: dict[int, list[int]] = {}

        async def one_client(n: int) -> None:
            async with Client(gw.url, mode="legacy") as client:
                for _ in range(rounds):
                    result = await client.call_tool("rec__tally", {"by": n})
                    totals.setdefault(n, []).append(int(result.content[0].text))  # type: ignore[union-attr]

        async with anyio.create_task_group() as tg:
            for n in range(1, 9):
                tg.start_soon(one_client, n)
    assert totals == {n: [n * k for k in range(1, rounds + 1)] for n in range(1, 9)}


# Each session costs ~80 ms of CPU here (two MCP handshakes); one left behind shows in the
# counts, so CI runs 40 (16 at once), AGW_SESSIONS=1000 the full count.
CHURN = int(os.environ.get("AGW_SESSIONS", "40"))


async def test_sessions_opened_and_closed_by_the_dozen_leave_nothing_behind(tmp_path: Path) -> None:
    # 16 sessions at once of one client: its share of the upstream's max_sessions must hold them.
    async with recorded_gateway("http", tmp_path, session="per_client", max_sessions=64) as (gw, _):
        async with Client(gw.url, mode="legacy") as warm:  # first-use allocations, not leaks
            await warm.call_tool("rec__whoami", {})
        before = await settled(
            gw, lambda s: s["sessions"]["live"] == 0 and s["upstream_sessions"]["dedicated"] == 0
        )
        limiter = anyio.Semaphore(16)

        async def one_session(n: int) -> None:
            async with limiter, Client(gw.url, mode="legacy" if n % 2 else "auto") as client:
                await client.call_tool("rec__whoami", {})

        async with anyio.create_task_group() as tg:
            for n in range(CHURN):
                tg.start_soon(one_session, n)
        after = await settled(
            gw,
            lambda s: (
                s["sessions"]["live"] == 0
                and s["upstream_sessions"]["dedicated"] == 0
                and s["tasks"] <= before["tasks"]
            ),
        )
    # A modern client's every request (discover, the call) is a session of its own.
    assert after["sessions"]["opened"] - before["sessions"]["opened"] >= CHURN
    assert (
        after["upstream_sessions"]["dedicated_opened"] - before["upstream_sessions"]["dedicated_opened"]
        == CHURN
    )
    assert after["pending_calls"] == 0
    # (The upstream is in-process HTTP: no child process to count. The per-client stdio test
    # above checks that dedicated sessions' processes end with them.)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("session", ["shared", "per_client"])
async def test_resource_updates_reach_the_subscribed_client_only(
    transport: str, session: str, tmp_path: Path
) -> None:
    updates: dict[str, list[str]] = {"subscriber": [], "bystander": []}

    def collect(who: str) -> Any:
        async def on_message(message: Any) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                updates[who].append(message.params.uri)

        return on_message

    async with (
        recorded_gateway(transport, tmp_path, protocol="legacy", session=session) as (gw, seen),
        Client(gw.url, mode="legacy", message_handler=collect("subscriber")) as subscriber,
        Client(gw.url, mode="legacy", message_handler=collect("bystander")) as bystander,
    ):
        await bystander.call_tool("rec__whoami", {})
        with pytest.warns(MCPDeprecationWarning):
            await subscriber.subscribe_resource("counter://value")
        await subscriber.call_tool("rec__bump", {})
        with anyio.fail_after(BOUND):
            while not updates["subscriber"]:
                await anyio.sleep(0.01)
        with pytest.warns(MCPDeprecationWarning):
            await subscriber.unsubscribe_resource("counter://value")
        events = await seen.wait_for(lambda ev: any(e["event"] == "unsubscribe" for e in ev))
    assert updates == {"subscriber": ["counter://value"], "bystander": []}
    assert [(e["event"], e["uri"]) for e in events if "subscribe" in e["event"]] == [
        ("subscribe", "counter://value"),
        ("unsubscribe", "counter://value"),
    ]


async def test_a_session_ended_while_subscribed_lets_its_subscriptions_go_upstream(tmp_path: Path) -> None:
    """A client that leaves without unsubscribing: its session's end unsubscribes on the shared
    upstream session, which would otherwise go on watching the resource for nobody."""
    async with recorded_gateway("http", tmp_path, protocol="legacy") as (gw, seen):
        async with Client(gw.url, mode="legacy") as subscriber:
            with pytest.warns(MCPDeprecationWarning):
                await subscriber.subscribe_resource("counter://value")
        events = await seen.wait_for(lambda ev: any(e["event"] == "unsubscribe" for e in ev))
        after = await settled(gw, lambda s: s["subscriptions"] == 0 and s["sessions"]["live"] == 0)
    assert upstream_subscriptions(events) == [
        ("subscribe", ["counter://value"]),
        ("unsubscribe", ["counter://value"]),
    ]
    assert after["pending_calls"] == 0


def upstream_subscriptions(events: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """What the recorder was asked to watch: subscribe/unsubscribe, or listen streams opened and ended."""
    shown: list[tuple[str, list[str]]] = []
    for e in events:
        if e["event"] in ("subscribe", "unsubscribe"):
            shown.append((e["event"], [e["uri"]]))
        elif e["event"] in ("listen", "listen_ended") and e["uris"]:
            shown.append((e["event"], e["uris"]))
    return shown


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_resource_updates_cross_the_gateway_in_both_eras(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        # A modern client's listen events show here too: count them from the stream only.
        if isinstance(message, types.ResourceUpdatedNotification) and mode == "legacy":
            updates.append(message.params.uri)

    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, seen),
        Client(gw.url, mode=mode, message_handler=on_message) as client,
    ):
        if mode == "legacy":
            with pytest.warns(MCPDeprecationWarning):
                await client.subscribe_resource("counter://value")
            await client.call_tool("rec__bump", {})
            with anyio.fail_after(BOUND):
                while not updates:
                    await anyio.sleep(0.01)
            with pytest.warns(MCPDeprecationWarning):
                await client.unsubscribe_resource("counter://value")
        else:
            async with client.listen(resource_subscriptions=["counter://value"]) as subscription:
                await client.call_tool("rec__bump", {})
                with anyio.fail_after(BOUND):
                    async for event in subscription:
                        updates.append(event.uri)  # type: ignore[union-attr]
                        break
        stopped = "unsubscribe" if protocol == "legacy" else "listen_ended"
        events = await seen.wait_for(lambda ev: any(e["event"] == stopped for e in ev))
        after = await settled(gw, lambda s: s["subscriptions"] == 0)
    assert updates == ["counter://value"]
    started = "subscribe" if protocol == "legacy" else "listen"
    assert upstream_subscriptions(events) == [(started, ["counter://value"]), (stopped, ["counter://value"])]
    assert after["pending_calls"] == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_listen_stream_the_upstream_ends_is_reopened_and_its_subscribers_told_to_read_again(
    transport: str, tmp_path: Path
) -> None:
    # A modern upstream replays nothing: what changed while its stream was down is unknown.
    uri = "counter://value"
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    def listens(events: list[dict[str, Any]]) -> int:
        return len([e for e in events if e["event"] == "listen" and e["uris"]])

    async with (
        recorded_gateway(transport, tmp_path, protocol="auto") as (gw, seen),
        Client(gw.url, mode="legacy", message_handler=on_message) as client,
    ):
        with pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource(uri)
        await client.call_tool("rec__end_listens", {})
        events = await seen.wait_for(lambda ev: listens(ev) == 2)
        with anyio.fail_after(BOUND):
            while not updates:
                await anyio.sleep(0.01)
        # Another resource's update as the barrier: the gateway relays an upstream's updates in
        # order, so it comes after any more the reopening sent.
        with pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource("note://x")
        await client.call_tool("rec__updates", {"uri": "note://x", "times": 1})
        with anyio.fail_after(BOUND):
            while "note://x" not in updates:
                await anyio.sleep(0.01)
    assert upstream_subscriptions(events)[:3] == [
        ("listen", [uri]),
        ("listen_ended", [uri]),
        ("listen", [uri]),
    ]
    # Nothing changed upstream while the stream was down: one update for the reopening (none
    # for either first opening), then the barrier's.
    assert updates == [uri, "note://x"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_roots_list_changed_reaches_the_clients_own_upstream_session(
    transport: str, tmp_path: Path
) -> None:
    roots = ["file:///work/one"]

    async def current_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri)) for uri in roots])

    def changes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in events if e.get("method") == "notifications/roots/list_changed"]

    who = "pid" if transport == "stdio" else "session"
    async with (
        recorded_gateway(transport, tmp_path, protocol="legacy", session="per_client") as (gw, seen),
        Client(gw.url, mode="legacy", list_roots_callback=current_roots) as client,
        Client(gw.url, mode="legacy", list_roots_callback=rooted) as other,
    ):
        first = await client.call_tool("rec__roots", {})
        mine = (await client.call_tool("rec__whoami", {})).structured_content
        theirs = (await other.call_tool("rec__whoami", {})).structured_content  # its own session
        roots[:] = ["file:///work/two"]
        await client.session.send_notification(types.RootsListChangedNotification())
        await seen.wait_for(lambda ev: bool(changes(ev)))
        # A round trip on the other client's session: a change sent there would be in by now.
        await other.call_tool("rec__whoami", {})
        second = await client.call_tool("rec__roots", {})
        told = [e[who] for e in changes(seen.all())]
    assert mine is not None
    assert theirs is not None
    assert mine[who] != theirs[who]
    assert first.structured_content == {"result": ["file:///work/one"]}
    assert second.structured_content == {"result": ["file:///work/two"]}
    assert told == [mine[who]]  # the client's own upstream session, and no other


@pytest.mark.parametrize("session", ["shared", "per_client"])
async def test_modern_clients_listening_at_once_each_get_each_update_once(
    session: str, tmp_path: Path
) -> None:
    got: dict[int, list[str]] = {0: [], 1: []}
    listening: list[anyio.CancelScope] = []

    async with recorded_gateway("http", tmp_path, protocol="auto", session=session) as (gw, seen):

        async def listener(n: int, ready: anyio.Event) -> None:
            async with (
                Client(gw.url, mode="auto") as client,
                client.listen(resource_subscriptions=["counter://value"]) as subscription,
            ):
                with anyio.CancelScope() as scope:
                    listening.append(scope)
                    ready.set()
                    async for event in subscription:
                        got[n].append(event.uri)  # type: ignore[union-attr]

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                ready = [anyio.Event(), anyio.Event()]
                for n in (0, 1):  # subscribing at the same moment
                    tg.start_soon(listener, n, ready[n])
                for event in ready:
                    await event.wait()
                async with Client(gw.url, mode="auto") as bumper:
                    await bumper.call_tool("rec__bump", {})
                while not (got[0] and got[1]):
                    await anyio.sleep(0.01)
                await anyio.sleep(0.3)  # a duplicate would arrive by now
                for scope in listening:
                    scope.cancel()
        after = await settled(gw, lambda s: s["subscriptions"] == 0)
        events = await seen.wait_for(
            lambda ev: (
                len([e for e in ev if e["event"] == "listen_ended" and e["uris"]])
                == len([e for e in ev if e["event"] == "listen" and e["uris"]])
            )
        )
    assert got == {0: ["counter://value"], 1: ["counter://value"]}
    # Shared: one upstream stream serves both clients; per_client: one on each client's session.
    assert len([e for e in events if e["event"] == "listen" and e["uris"]]) == (
        1 if session == "shared" else 2
    )
    assert after["pending_calls"] == 0


async def test_a_subscription_lost_with_its_upstream_tells_the_client(tmp_path: Path) -> None:
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    async with (
        recorded_gateway("stdio", tmp_path, protocol="legacy") as (gw, _),
        Client(gw.url, mode="legacy", message_handler=on_message) as client,
    ):
        pid = (await client.call_tool("rec__whoami", {})).structured_content["pid"]  # type: ignore[index]
        with pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource("counter://value")
        assert (await status(gw))["subscriptions"] == 1
        os.kill(pid, 9)
        with anyio.fail_after(BOUND):
            while not updates:
                await anyio.sleep(0.01)
        after = await settled(gw, lambda s: s["subscriptions"] == 0)
    assert updates == ["counter://value"]  # read it again: the upstream that held it is gone
    assert after["pending_calls"] == 0
