"""A replica holds at most ``server.max_sessions`` handshake-era sessions, and many clients
cannot fill them for everyone.

Anonymous clients are told apart by address, and a local process may use any loopback
address: 100 addresses holding 100 sessions each filled the SDK's 10,000 (9.5 GB of RSS with
58 KB ``initialize`` bodies), after which every new session was refused for the idle timeout
(30 min). At the bound the session idle the longest of the client holding the most (more than
the newcomer) ends for the newcomer; a session with its stream or a request open never does;
with none idle the newcomer is told to retry (503). Found by this stop's attack (stop 52).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import httpx
from fastmcp import FastMCP

from tests.replicas.test_store import ACCEPT, VERSION, events, opened
from tests.support import RunningGateway, running_gateway, serving_upstream

PING = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
HELLO = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}


def _echo(seen: list[str], release: anyio.Event) -> FastMCP:
    server = FastMCP("echo")

    @server.tool
    def echo(text: str) -> str:
        seen.append(text)
        return text

    @server.tool
    async def hold() -> str:
        seen.append("held")
        await release.wait()
        return "released"

    return server


@asynccontextmanager
async def gateway(
    seen: list[str], max_sessions: int, release: anyio.Event | None = None
) -> AsyncIterator[RunningGateway]:
    async with serving_upstream(_echo(seen, release or anyio.Event())) as url:
        config = {"server": {"max_sessions": max_sessions}, "upstreams": {"echo": {"url": url}}}
        async with running_gateway(config) as gw:
            yield gw


def from_address(address: str) -> httpx.AsyncClient:
    """A client whose connections come from ``address`` (an anonymous client of its own)."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), timeout=10)


async def status(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int:
    return (await http.post(url, json=PING, headers={**headers, **ACCEPT})).status_code


async def echo(http: httpx.AsyncClient, url: str, headers: dict[str, str], text: str) -> str:
    """``echo__echo`` called on the session ``headers`` name; the text it answered."""
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call"}
    call["params"] = {"name": "echo__echo", "arguments": {"text": text}}
    answer = await http.post(url, json=call, headers={**headers, **ACCEPT})
    assert answer.status_code == 200, answer.text
    body = answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        body = next(line[5:] for line in body.splitlines() if line.startswith("data:") and '"result"' in line)
    result: dict[str, Any] = json.loads(body)["result"]
    return result["content"][0]["text"]


def session_of(answer: httpx.Response) -> dict[str, str]:
    return {"Mcp-Session-Id": answer.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}


async def opened_once_room(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A session opened as ``opened`` does, its ``initialize`` retried while refused (503)."""
    with anyio.fail_after(10):
        while (answer := await http.post(url, json=HELLO, headers=ACCEPT)).status_code == 503:
            await anyio.sleep(0.02)
    assert answer.status_code == 200, answer.text
    headers = session_of(answer)
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=done, headers={**headers, **ACCEPT})).status_code == 202
    return headers


async def ended(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
    """Returns once the session ``headers`` name is gone (404)."""
    with anyio.fail_after(10):
        while await status(http, url, headers) != 404:
            await anyio.sleep(0.02)


async def test_at_the_bound_the_largest_holders_idle_session_ends_and_a_bystander_is_served() -> None:
    seen: list[str] = []
    async with (
        gateway(seen, max_sessions=8) as gw,
        from_address("127.0.0.1") as bystander,
        from_address("127.0.0.2") as hoarder,
        from_address("127.0.0.3") as other,
        AsyncExitStack() as streams,
    ):
        mine = await opened(bystander, gw.url)  # the bystander's, idle the longest of all
        others = [await opened(other, gw.url) for _ in range(2)]  # idle longer than the hoarder's
        busy = await opened(hoarder, gw.url)
        await streams.enter_async_context(events(hoarder, gw.url, busy))  # never idle
        hoarded = [await opened(hoarder, gw.url) for _ in range(4)]  # 1 + 2 + 5: the bound
        # The bystander's second session: the session idle the longest of the client holding
        # the most (the hoarder) ends for it; neither its own nor the other's, idle longer.
        second = await opened(bystander, gw.url)
        await ended(hoarder, gw.url, hoarded[0])
        assert await echo(bystander, gw.url, second, "served") == "served"
        assert await echo(bystander, gw.url, mine, "still") == "still"
        # A newcomer on an address of its own (holding none): again the hoarder's (4 to 2).
        async with from_address("127.0.0.4") as newcomer:
            fresh = await opened(newcomer, gw.url)
            await ended(hoarder, gw.url, hoarded[1])
            assert await echo(newcomer, gw.url, fresh, "new") == "new"
        statuses = [await status(hoarder, gw.url, h) for h in (busy, *hoarded[2:])]
        statuses += [await status(other, gw.url, h) for h in others]
    assert statuses == [200] * 5  # the busy one, the hoarder's last two, the other's two
    assert seen == ["served", "still", "new"]  # each call reached the upstream


async def test_with_every_session_busy_a_new_one_is_refused_until_one_is_idle() -> None:
    seen: list[str] = []
    async with (
        gateway(seen, max_sessions=2) as gw,
        from_address("127.0.0.2") as first,
        from_address("127.0.0.3") as second,
        from_address("127.0.0.4") as newcomer,
    ):
        one, two = await opened(first, gw.url), await opened(second, gw.url)
        async with events(first, gw.url, one):
            async with events(second, gw.url, two):
                refused = await newcomer.post(gw.url, json=HELLO, headers=ACCEPT)
            # The second's stream closed: its session is idle, and gives way to the newcomer.
            mine = await opened_once_room(newcomer, gw.url)
            await ended(second, gw.url, two)
            assert await echo(newcomer, gw.url, mine, "in") == "in"
            assert await status(first, gw.url, one) == 200
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert "server.max_sessions" in error["message"]
    assert "retry later" in error["message"]
    assert seen == ["in"]


async def test_with_none_idle_a_client_holding_two_more_gives_up_its_oldest_session_that_only_listens() -> (
    None
):
    # Sessions kept busy by their streams alone would keep the bound full for everyone: the
    # client holding the most gives up its oldest that only listens; a call in flight, never.
    seen: list[str] = []
    release = anyio.Event()
    hold = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo__hold", "arguments": {}},
    }
    answers: list[httpx.Response] = []
    statuses: list[int] = []
    async with (
        gateway(seen, max_sessions=4, release=release) as gw,
        from_address("127.0.0.1") as bystander,
        from_address("127.0.0.2") as hoarder,
        from_address("127.0.0.3") as newcomer,
        AsyncExitStack() as streams,
        anyio.create_task_group() as tg,
    ):
        calling = await opened(hoarder, gw.url)  # the oldest: a call in flight, no stream
        oldest, newer = await opened(hoarder, gw.url), await opened(hoarder, gw.url)
        mine = await opened(bystander, gw.url)
        for headers in (oldest, newer):
            await streams.enter_async_context(events(hoarder, gw.url, headers))
        await streams.enter_async_context(events(bystander, gw.url, mine))

        async def call_held() -> None:
            answers.append(await hoarder.post(gw.url, json=hold, headers={**calling, **ACCEPT}))

        tg.start_soon(call_held)
        with anyio.fail_after(10):
            while "held" not in seen:
                await anyio.sleep(0.02)
        fresh = await opened(newcomer, gw.url)  # none idle: the hoarder's "oldest" ends
        await ended(hoarder, gw.url, oldest)
        assert await echo(newcomer, gw.url, fresh, "in") == "in"
        statuses += [await status(hoarder, gw.url, newer), await status(bystander, gw.url, mine)]
        release.set()
        with anyio.fail_after(10):
            while not answers:
                await anyio.sleep(0.02)
    assert statuses == [200, 200]
    assert answers[0].status_code == 200
    assert "released" in answers[0].text  # the call in flight was never cut
    assert seen == ["held", "in"]


async def test_sessions_opened_at_once_do_not_pass_the_bound() -> None:
    # Admission decides before the SDK registers a session (it yields in between): sessions
    # being opened are counted, else twelve at once all found room for one.
    seen: list[str] = []
    async with gateway(seen, max_sessions=4) as gw:
        answers: list[tuple[httpx.AsyncClient, httpx.Response]] = []

        async def open_from(address: str) -> None:
            http = await stack.enter_async_context(from_address(address))
            answers.append((http, await http.post(gw.url, json=HELLO, headers=ACCEPT)))

        async with AsyncExitStack() as stack:
            async with anyio.create_task_group() as tg:
                for n in range(12):
                    tg.start_soon(open_from, f"127.0.1.{n + 1}")
            alive = [await status(http, gw.url, session_of(a)) for http, a in answers if a.status_code == 200]
    assert sorted({a.status_code for _, a in answers}) in ([200], [200, 503])
    assert 1 <= alive.count(200) <= 4, alive


async def test_only_a_request_that_opens_a_session_makes_room() -> None:
    # A POST without a session id that opens none (a ping, an initialize for a version the
    # gateway does not speak) ended the largest holder's idle session for nothing: its sender
    # held none after, so it could end every idle session on the replica (stop 52's review).
    seen: list[str] = []
    async with (
        gateway(seen, max_sessions=2) as gw,
        from_address("127.0.0.2") as holder,
        from_address("127.0.0.3") as sender,
    ):
        held = [await opened(holder, gw.url), await opened(holder, gw.url)]  # the bound, idle
        ping = await sender.post(gw.url, json=PING, headers=ACCEPT)
        unknown = {**ACCEPT, "Mcp-Protocol-Version": "1999-01-01"}
        foreign = await sender.post(gw.url, json=HELLO, headers=unknown)
        statuses = [await status(holder, gw.url, h) for h in held]
    assert ping.status_code == 400, ping.text  # the SDK's: no session id
    assert foreign.status_code == 400, foreign.text
    assert statuses == [200, 200]


async def test_a_client_opening_many_at_once_ranks_by_what_it_is_opening_too() -> None:
    # Counted by its open sessions alone, a newcomer opening several at once ranked as holding
    # none for each, and ended a bystander's session holding one (stop 52's review).
    seen: list[str] = []
    async with (
        gateway(seen, max_sessions=3) as gw,
        from_address("127.0.0.1") as bystander,
        from_address("127.0.0.2") as other,
        from_address("127.0.0.3") as newcomer,
    ):
        mine = await opened(bystander, gw.url)  # idle the longest
        others = [await opened(other, gw.url), await opened(other, gw.url)]
        answers: list[int] = []

        async def open_one() -> None:
            answers.append((await newcomer.post(gw.url, json=HELLO, headers=ACCEPT)).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(open_one)
        for headers in others:
            await ended(other, gw.url, headers)
        assert await echo(bystander, gw.url, mine, "kept") == "kept"
    assert answers.count(200) >= 2, answers
    assert seen == ["kept"]
