"""Large results (issue 16, finding 10): the gateway holds at most ``server.max_bytes_in_flight``
of upstream answers at once. An answer that would pass the bound is refused with a clear
error, the bytes of an answer are given back once it has been written to its client, and a
bystander is served throughout."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import anyio
import httpx
import mcp_types as types
import pytest
from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import Field
from starlette.types import ASGIApp, Scope, Send

from agent_gateway.in_flight import IN_FLIGHT
from agent_gateway.memory import Trimmer
from tests.replicas.test_store import ACCEPT, opened
from tests.support import gateway_child, intercepted, running_gateway, serving, serving_upstream
from tests.test_gateway import modern_request
from tests.test_transports import serving_websocket_upstream

Serve = Callable[[FastMCP], contextlib.AbstractAsyncContextManager[str]]
"""An upstream served over a transport: Streamable HTTP, WebSocket."""
BOUND = 48 * 2**20
SIZE = 16 * 2**20
"""A result's text; FastMCP adds it again as ``structuredContent``: 32 MiB an answer, so one
answer fits the bound and two do not."""
WAIT = 30.0


def big_server(finished: anyio.Event | None = None) -> FastMCP:
    server = FastMCP("big")

    @server.tool
    def big(size: int) -> str:
        return "x" * size

    @server.tool
    def ping() -> str:
        return "pong"

    @server.tool
    def echo(text: str) -> str:
        return text

    @server.resource("big://text")
    def big_text() -> str:
        return "x" * (2 * SIZE)

    @server.tool
    async def late(ctx: Context) -> str:
        """Reports progress (its answer becomes a stream), then answers a while later."""
        await ctx.report_progress(0, 1)
        await anyio.sleep(1)
        if finished is not None:
            finished.set()
        return "x" * SIZE

    return server


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.02)


async def body_of(response: httpx.Response) -> bytes:
    return b"".join([chunk async for chunk in response.aiter_bytes()])


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@asynccontextmanager
async def slow_reader(url: str, address: str, size: int) -> AsyncIterator[httpx.Response]:
    """A ``big`` call from ``address`` whose answer is read only when the caller reads it."""
    body, headers = modern_request("big__big", {"size": size})
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with (
        httpx.AsyncClient(timeout=WAIT, transport=transport) as http,
        http.stream("POST", url, json=body, headers=headers) as held,
    ):
        yield held


SHARED = 11 * 2**20
"""22 MiB an answer: within one client's share of ``BOUND`` (24 MiB); two of them, held for
two clients, leave no room for a third's."""


async def test_an_answer_past_the_bound_is_refused_until_the_one_held_is_written() -> None:
    async with serving_upstream(big_server()) as url:
        config = {"server": {"max_bytes_in_flight": BOUND}, "upstreams": {"big": {"url": url}}}
        async with running_gateway(config) as gw, Client(gw.url) as other:
            async with (
                slow_reader(gw.url, "127.0.0.2", SHARED) as one,
                slow_reader(gw.url, "127.0.0.3", SHARED) as two,
            ):
                # The gateway writes the answers while their clients read none of them: held.
                await until(lambda: IN_FLIGHT.held >= 4 * SHARED)
                refused = await other.call_tool("big__big", {"size": SHARED})
                bystander = await other.call_tool("big__ping", {})
                written = [json.loads(await body_of(held)) for held in (one, two)]
            # Written: their bytes are given back, and the same call is served.
            await until(lambda: IN_FLIGHT.held == 0)
            served = await other.call_tool("big__big", {"size": SHARED})
    assert refused.is_error
    assert "the gateway holds its bound of 48 MiB of answers in flight" in text(refused)
    assert "retry shortly" in text(refused)
    assert text(bystander) == "pong"
    assert [len(w["result"]["content"][0]["text"]) for w in written] == [SHARED, SHARED]
    assert not served.is_error
    assert len(text(served)) == SHARED


def memory_mb(pid: int, field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (the kernel's own peak, not a sample) of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def reset_peak(pid: int) -> None:
    """``VmHWM`` counted from now on."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@pytest.mark.parametrize(
    ("way", "serve"),
    [("tool", serving_upstream), ("resource", serving_upstream), ("tool", serving_websocket_upstream)],
)
async def test_a_large_answer_is_held_about_twice_on_its_way_not_five_times(
    tmp_path: Path, way: str, serve: Serve
) -> None:
    # Parsed by pydantic's JSON parser, written as JSON text and then encoded, and buffered
    # whole by the socket's transport, an answer was held five times over at the peak. A tool
    # call to this (modern) upstream is forwarded below the SDK's client; a resource read is
    # parsed by that client: both ways are held. Over a WebSocket every message was parsed by
    # pydantic's parser.
    answer_mb = 2 * SIZE / 2**20
    async with (
        serve(big_server()) as url,
        gateway_child({"upstreams": {"big": {"url": url}}}, tmp_path) as (base, child),
        Client(f"{base}/mcp", mode="legacy") as client,
    ):
        await client.call_tool("big__ping", {})
        reset_peak(child.pid)
        before = memory_mb(child.pid, "VmRSS")
        if way == "tool":
            answer = text(await client.call_tool("big__big", {"size": SIZE}))
        else:
            answer = resource_text(await client.read_resource("big://text"))
        peak = memory_mb(child.pid, "VmHWM") - before
    assert len(answer) == (SIZE if way == "tool" else 2 * SIZE)
    # The websockets library joins a message's frames into one (the frames and the whole, once).
    times = 3.5 if serve is serving_websocket_upstream else 3
    assert peak < times * answer_mb, f"+{peak:.0f} MB at the peak for a {answer_mb:.0f} MB answer"


async def test_the_memory_large_answers_used_is_given_back_once_they_are_let_go(tmp_path: Path) -> None:
    # The C library keeps what a process frees for its next allocations: after eight 32 MiB
    # answers at once (those past the client's share refused) the gateway stayed about 75 MB
    # larger than before them, for good.
    async with (
        serving_upstream(big_server()) as url,
        gateway_child({"upstreams": {"big": {"url": url}}}, tmp_path) as (base, child),
    ):
        served: list[bool] = []

        async def one() -> None:
            async with Client(f"{base}/mcp", mode="legacy") as client:
                served.append(not (await client.call_tool("big__big", {"size": SIZE})).is_error)

        async with Client(f"{base}/mcp", mode="legacy") as client:
            await client.call_tool("big__ping", {})
        before = memory_mb(child.pid, "VmRSS")
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(one)
        assert any(served)  # some memory was used (those past the client's share were refused)
        await until(lambda: memory_mb(child.pid, "VmRSS") - before < 16)


async def test_large_answers_let_go_after_a_walk_get_a_walk_of_their_own() -> None:
    # A burst of large answers costs one walk; one let go after it needs the next: when the
    # walk that ran stayed due, no later answer's memory was given back while the gateway ran.
    trimmer = Trimmer()
    trimmer.after_large()
    trimmer.after_large()
    await until(lambda: trimmer.trims == 1)
    trimmer.after_large()
    await until(lambda: trimmer.trims == 2)


def resource_text(result: types.ReadResourceResult) -> str:
    contents = result.contents[0]
    assert isinstance(contents, types.TextResourceContents)
    return contents.text


async def test_a_result_whose_client_hung_up_is_not_held() -> None:
    # The client leaves while its call still runs, and the result comes back with nobody to
    # write it to: whether the exchange ended first (it is not held) or ends after it (a call
    # served in its POST's task: it is given back then), nothing may go on holding it.
    finished = anyio.Event()
    async with (
        serving_upstream(big_server(finished)) as url,
        running_gateway({"upstreams": {"big": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=WAIT) as http,
    ):
        headers = {**await opened(http, gw.url), **ACCEPT}
        call = {"name": "big__late", "arguments": {}, "_meta": {"progressToken": "p"}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
        async with http.stream("POST", gw.url, json=body, headers=headers) as answer:
            async for line in answer.aiter_lines():
                if "notifications/progress" in line:
                    break  # hang up, the call still running
        with anyio.fail_after(WAIT):
            await finished.wait()
        await until(lambda: any(c.name == "big__late" for c in gw.gateway.activity.calls))
        await until(lambda: IN_FLIGHT.held == 0)
        held = IN_FLIGHT.held
        ping = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "big__ping", "arguments": {}},
        }
        after = (await http.post(gw.url, json=ping, headers=headers)).json()
    assert held == 0
    assert after["result"]["content"][0]["text"] == "pong"


OUT_OF_CONTENT = 3 * 2**20
"""Over one client's share of a 4 MiB bound, in a part of a result that is not its content."""
WIDE = "d" * (3 * 2**18)
"""A parameter's description (768 KiB, under a schema's 1 MiB bound): its tool's definition
is a search's answer past the share of a 1 MiB bound (an answer holds the definitions within
about 128 KiB, and one at least)."""


def out_of_content_server() -> FastMCP:
    """Results whose bytes are outside content: a completion's values, a result's ``_meta``,
    and tool schemas (which ``search_tools`` returns whole)."""
    server = FastMCP("odd")

    @server.tool
    def annotated() -> ToolResult:
        return ToolResult(
            content=[types.TextContent(type="text", text="small")], meta={"blob": "m" * OUT_OF_CONTENT}
        )

    @server.tool(description="lookup of things")
    def wide(query: Annotated[str, Field(description=WIDE)]) -> str:
        return query

    @server.prompt
    def poem(theme: str) -> str:
        return theme

    @server.completion
    def complete(ref: Any, argument: Any, context: Any) -> list[str]:
        return ["c" * OUT_OF_CONTENT]

    return server


@pytest.mark.parametrize("asked", ["completion", "meta", "search"])
async def test_an_answer_past_the_clients_share_is_refused_whatever_part_of_it_holds_the_bytes(
    asked: str,
) -> None:
    # Sized by its content alone, each of these was held for nothing: one client asking for
    # many and reading none of them grew the gateway by gigabytes.
    async with serving_upstream(out_of_content_server()) as url:
        config = {
            "server": {"max_bytes_in_flight": 2**20 if asked == "search" else 4 * 2**20},
            "search": {"mode": "on"},
            "upstreams": {"odd": {"url": url}},
        }
        async with running_gateway(config) as gw, Client(gw.url) as client:
            if asked == "completion":
                prompt = types.PromptReference(type="ref/prompt", name="odd__poem")
                with pytest.raises(MCPError, match="retry shortly"):
                    await client.complete(prompt, {"name": "theme", "value": ""})
                return
            if asked == "meta":
                refused = await client.call_tool("odd__annotated", {})
            else:
                refused = await client.call_tool("search_tools", {"query": "lookup things", "limit": 5})
    assert refused.is_error
    assert "retry shortly" in text(refused)


async def held_body(url: str, address: str, sent: int, declared: int) -> tuple[Any, Any]:
    """A POST from ``address`` declaring ``declared`` bytes of body and sending ``sent`` of them."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, local_addr=(address, 0))
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Length: {declared}\r\n\r\n"
    )
    writer.write(head.encode() + b" " * sent)
    await writer.drain()
    return reader, writer


async def answer_of(reader: Any) -> bytes:
    """What the gateway answered before it closed the connection (reset: the body unread)."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            answer += chunk
    return answer


async def test_request_bodies_held_count_against_the_clients_share_and_the_bystander_is_served() -> None:
    # One address's 512 connections each sending 4 MiB of a body it never finished held 2 GB
    # for as long as the body timeout, again and again; then two clients' bodies, each within
    # its share, left no room for anyone's answers. Found by a helper's attack (stop 51).
    chunk, share = 2**20, BOUND // 4
    async with serving_upstream(big_server()) as url:
        config = {"server": {"max_bytes_in_flight": BOUND}, "upstreams": {"big": {"url": url}}}
        async with running_gateway(config) as gw, Client(gw.url) as bystander:
            held = []
            try:
                for address in ("127.0.0.2", "127.0.0.3"):
                    for _ in range(share // chunk):
                        held.append(await held_body(gw.url, address, chunk, 2 * chunk))
                        await until(lambda: IN_FLIGHT.held >= len(held) * chunk)
                refusals = []
                for address in ("127.0.0.2", "127.0.0.4"):  # past its share; past the bodies' half
                    reader, writer = await held_body(gw.url, address, chunk, 2 * chunk)
                    held.append((reader, writer))
                    with anyio.fail_after(WAIT):
                        refusals.append(await answer_of(reader))
                served = await bystander.call_tool("big__echo", {"text": "y" * 1000})
                answered = await bystander.call_tool("big__big", {"size": SHARED})  # 22 MiB: the other half
            finally:
                for _, writer in held:
                    writer.close()
            await until(lambda: IN_FLIGHT.held == 0)  # each body given back as its client left
    assert all(r.startswith(b"HTTP/1.1 503") for r in refusals), [r[:200] for r in refusals]
    assert b"client 'anonymous' holds 12 MiB of requests and answers in flight" in refusals[0]
    assert b"the gateway holds its bound of request bodies in flight (24 MiB of 24 MiB" in refusals[1]
    assert text(served) == "y" * 1000
    assert len(text(answered)) == SHARED


EVENT = 20 * 2**20
"""An unfinished event's bytes: two fit ``BOUND``, three do not."""


def endless_events(server: FastMCP, ended: anyio.Event) -> ASGIApp:
    """``server`` over Streamable HTTP, its ``endless`` calls answered with an SSE stream of one
    event that never ends: ``EVENT`` bytes of it, then nothing until ``ended``."""

    async def intercept(scope: Scope, request: dict[str, Any], send: Send) -> bool:
        if (request.get("params") or {}).get("name") != "endless":
            return False
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        head = b'event: message\ndata: {"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"'
        await send(
            {
                "type": "http.response.body",
                "body": head % json.dumps(request["id"]).encode(),
                "more_body": True,
            }
        )
        for _ in range(EVENT // 2**20):
            await send({"type": "http.response.body", "body": b"x" * 2**20, "more_body": True})
        with anyio.move_on_after(3 * WAIT):
            await ended.wait()
        return True

    return intercepted(server, intercept)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_the_unfinished_event_of_a_streamed_answer_counts_in_flight(protocol: str) -> None:
    # Not counted, sixteen calls each answered with one endless 100 MiB event held 1.8 GB
    # (every event under max_message_bytes, the bound each event is read under).
    ended = anyio.Event()
    server = big_server()
    server.tool(lambda: "never sent", name="endless")
    refused: list[types.CallToolResult] = []
    async with serving(endless_events(server, ended)) as base:
        upstream = {"url": f"{base}/mcp", "protocol": protocol, "timeout": 10}
        config = {"server": {"max_bytes_in_flight": BOUND}, "upstreams": {"big": upstream}}
        try:
            async with running_gateway(config) as gw, Client(gw.url) as client, Client(gw.url) as bystander:
                async with anyio.create_task_group() as tg:

                    async def call() -> None:
                        refused.append(await client.call_tool("big__endless", {}))

                    for _ in range(3):
                        tg.start_soon(call)
                    await until(lambda: bool(refused) and IN_FLIGHT.held >= 2 * EVENT)
                    assert text(await bystander.call_tool("big__ping", {})) == "pong"
                    tg.cancel_scope.cancel()  # the two streaming: given up, their bytes go back
                await until(lambda: IN_FLIGHT.held == 0)
        finally:
            ended.set()  # only now do the upstream's streams end
    [one] = refused
    assert one.is_error
    assert "the gateway holds its bound of 48 MiB of answers in flight" in text(one)
