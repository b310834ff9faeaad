"""Upstream life: failures at start-up, recovery, crashes, hangs, catalog changes, reaping."""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from anyio.abc import TaskStatus
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.server.lowlevel import Server
from starlette.types import Receive, Scope, Send

from agent_gateway.runtime import child_pids
from agent_gateway.upstreams.connection import describe_target
from tests.security.test_list_pages import shifting_server
from tests.support import (
    config_of,
    free_socket,
    outliving_its_input,
    python_upstream,
    running_gateway,
    serving,
    serving_upstream,
)


def gated_server(gate: anyio.Event) -> FastMCP:
    server = FastMCP("slow")

    @server.tool
    async def wait() -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "released"

    @server.tool
    def ping() -> str:
        """Answer at once."""
        return "pong"

    return server


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def wait_until(predicate: Any, bound: float) -> None:
    with anyio.fail_after(bound):
        while not predicate():
            await anyio.sleep(0.02)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_an_upstream_down_at_start_up_does_not_stop_the_others_and_is_reported() -> None:
    dead = free_socket()  # bound, never listening: connections are refused
    config = {
        "upstreams": {
            "counter": python_upstream("counter.py"),
            "gone": {"url": f"http://127.0.0.1:{dead.getsockname()[1]}/mcp"},
        }
    }
    try:
        async with (
            running_gateway(config) as gw,
            Client(gw.url) as client,
            httpx.AsyncClient(base_url=gw.base) as http,
        ):
            assert text_of(await client.call_tool("counter__increment", {"by": 2})) == "2"
            ready = await http.get("/readyz")
            assert ready.status_code == 503
            assert [m["name"] for m in ready.json()["missing"]] == ["gone"]
            assert ready.json()["missing"][0]["last_error"]
    finally:
        dead.close()


async def serve_until(server: FastMCP, stop: anyio.Event, *, task_status: TaskStatus[str]) -> None:
    """Serve ``server`` in this task (so it can stop while others run) until ``stop`` is set."""
    async with serving_upstream(server) as url:
        task_status.started(url)
        await stop.wait()


def resources_without_templates() -> Server:
    """A low-level server of a tool and a resource, given no templates handler: it answers
    ``resources/templates/list`` with Method not found."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text="echoed")])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri="mem://a", name="a")])

    async def read_resource(ctx: Any, params: Any) -> types.ReadResourceResult:
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="A")])

    return Server(
        "plain",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_upstream_of_resources_without_a_templates_method_is_served_whole(mode: str) -> None:
    async with (
        serving(resources_without_templates().streamable_http_app()) as base,
        running_gateway({"upstreams": {"plain": {"url": f"{base}/mcp", "protocol": mode}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        tools = [tool.name for tool in (await client.list_tools()).tools]
        called = await client.call_tool("plain__echo", {})
        resources = [str(resource.uri) for resource in (await client.list_resources()).resources]
        read = await client.read_resource("mem://a")
        templates = (await client.list_resource_templates()).resource_templates
    assert "plain__echo" in tools
    assert called.content == [types.TextContent(text="echoed")]
    assert resources == ["mem://a"]
    assert read.contents == [types.TextResourceContents(uri="mem://a", text="A")]
    assert templates == []


async def test_a_call_to_an_upstream_that_went_away_fails_quickly_naming_it() -> None:
    stop, stopped = anyio.Event(), anyio.Event()

    async def upstream(*, task_status: TaskStatus[str]) -> None:
        await serve_until(gated_server(anyio.Event()), stop, task_status=task_status)
        stopped.set()

    async with anyio.create_task_group() as tg:
        url = await tg.start(upstream)
        config = {"upstreams": {"slow": {"url": url, "timeout": 30}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            assert text_of(await client.call_tool("slow__ping", {})) == "pong"
            stop.set()
            with anyio.fail_after(10):
                await stopped.wait()
            started = time.monotonic()
            result = await client.call_tool("slow__ping", {})
            elapsed = time.monotonic() - started
            again = await client.call_tool("slow__ping", {})
            assert result.is_error
            assert "upstream 'slow'" in text_of(result)
            assert elapsed < 10  # well inside the 30 s timeout
            assert again.is_error
            assert "upstream 'slow'" in text_of(again)


async def test_an_upstream_that_comes_up_later_is_connected_and_clients_are_told() -> None:
    sock = free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    changes: list[IncomingMessage] = []

    async def record(message: IncomingMessage) -> None:
        changes.append(message)

    async with (
        running_gateway({"upstreams": {"late": {"url": url}}}) as gw,
        Client(gw.url, mode="legacy", message_handler=record) as client,
    ):
        assert [t.name for t in (await client.list_tools()).tools] == ["ask_agent"]  # the gateway's own only
        async with serving_upstream(gated_server(anyio.Event()), sock):
            await wait_until(
                lambda: any(isinstance(m, types.ToolListChangedNotification) for m in changes), 20
            )
            assert "late__ping" in {t.name for t in (await client.list_tools()).tools}
            assert text_of(await client.call_tool("late__ping", {})) == "pong"


async def test_with_startup_wait_the_gateway_serves_before_a_slow_upstream_which_joins_later() -> None:
    # Listening, not served: the gateway's connection is accepted by the kernel and its
    # initialize waits in the backlog, as at an upstream slow to start (an npx download).
    sock = free_socket()
    sock.listen()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    changes: list[IncomingMessage] = []

    async def record(message: IncomingMessage) -> None:
        changes.append(message)

    config = {"server": {"startup_wait": 0.5}, "upstreams": {"slow": {"url": url, "connect_timeout": 60}}}
    with anyio.fail_after(20):  # without startup_wait, start-up waits out the connect_timeout
        async with (
            running_gateway(config) as gw,
            Client(gw.url, mode="legacy", message_handler=record) as client,
        ):
            assert [t.name for t in (await client.list_tools()).tools] == ["ask_agent"]
            async with serving_upstream(gated_server(anyio.Event()), sock):
                await wait_until(
                    lambda: any(isinstance(m, types.ToolListChangedNotification) for m in changes), 15
                )
                assert text_of(await client.call_tool("slow__ping", {})) == "pong"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstream_tool_list_change_is_relayed_to_clients(mode: str) -> None:
    changed = anyio.Event()

    async def record(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    config = {"upstreams": {"counter": python_upstream("counter.py")}}
    async with (
        running_gateway(config) as gw,
        Client(gw.url, mode="legacy", message_handler=record) as watcher,
    ):
        async with Client(gw.url, mode=mode) as caller:
            await caller.call_tool("counter__add_tool", {"name": "fresh"})
        with anyio.fail_after(10):
            await changed.wait()
        assert "counter__fresh" in {t.name for t in (await watcher.list_tools()).tools}


async def test_an_upstream_listed_again_unchanged_changes_nothing_clients_are_told_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each listing built a new part: a new catalog version, every client in the upstream's
    # reach told its list changed, the upstream's tools indexed (and embedded) again. An
    # upstream saying list_changed with nothing changed, or one whose pins could not be
    # written (listed again every 5 s), did all of it each time.
    caplog.set_level(logging.INFO, logger="agent_gateway.upstreams.connection")
    changes: list[types.ToolListChangedNotification] = []

    async def record(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changes.append(message)

    def relisted() -> int:
        return sum("changed its catalog; refreshed" in r.getMessage() for r in caplog.records)

    config = {"upstreams": {"counter": python_upstream("counter.py")}}
    async with (
        running_gateway(config) as gw,
        Client(gw.url, mode="legacy", message_handler=record) as watcher,
    ):
        await watcher.call_tool("counter__add_tool", {"name": "fresh"})
        await wait_until(lambda: relisted() == 1 and len(changes) == 1, 10)
        version = gw.gateway.catalog.snapshot.version
        await watcher.call_tool("counter__add_tool", {"name": "fresh"})  # the same tool again
        await wait_until(lambda: relisted() == 2, 10)
        assert gw.gateway.catalog.snapshot.version == version
        await watcher.call_tool("counter__add_tool", {"name": "later"})  # a change after it
        await wait_until(lambda: len(changes) == 2, 10)
    assert gw.gateway.catalog.snapshot.version == version + 1


async def test_a_modern_client_hears_of_catalog_changes_on_its_listen_stream() -> None:
    config = {"upstreams": {"counter": python_upstream("counter.py")}}
    async with running_gateway(config) as gw, Client(gw.url, mode="auto") as client:
        async with client.listen(tools_list_changed=True) as subscription:
            await client.call_tool("counter__add_tool", {"name": "later"})
            with anyio.fail_after(10):
                event = await subscription.__anext__()
        assert type(event).__name__ == "ToolsListChanged"
        assert "counter__later" in {t.name for t in (await client.list_tools()).tools}


async def test_an_upstreams_prompt_and_resource_list_changes_reach_clients_of_both_eras() -> None:
    # The upstream's `shift` changes its prompts and resources and says so: a handshake-era
    # client is sent both notifications, a modern one hears both on its listen stream.
    heard: list[str] = []

    async def record(message: IncomingMessage) -> None:
        heard.append(type(message).__name__)

    wanted = {"PromptListChangedNotification", "ResourceListChangedNotification"}
    async with (
        serving_upstream(shifting_server("a", 4)) as url,
        running_gateway({"upstreams": {"a": {"url": url}}}) as gw,
        Client(gw.url, mode="legacy", message_handler=record) as watcher,
        Client(gw.url, mode="auto") as modern,
        modern.listen(prompts_list_changed=True, resources_list_changed=True) as subscription,
    ):
        assert text_of(await modern.call_tool("a__shift", {})) == "shifted"
        events: set[str] = set()
        with anyio.fail_after(10):
            while len(events) < 2:
                events.add(type(await subscription.__anext__()).__name__)
        await wait_until(lambda: wanted <= set(heard), 10)
        assert "a__new1" in {p.name for p in (await watcher.list_prompts()).prompts}
    assert events == {"PromptsListChanged", "ResourcesListChanged"}


def reshaping_server() -> FastMCP:
    """A tool ``put`` taking an integer ``a``, and a tool ``reshape`` that makes ``a`` a string."""
    server = FastMCP("shapes")

    @server.tool
    def put(a: int) -> str:
        return f"put {a}"

    def put_text(a: str) -> str:
        return f"put {a}"

    @server.tool
    async def reshape(ctx: Context) -> str:
        server.local_provider.remove_tool("put")
        server.tool(name="put")(put_text)
        await ctx.send_notification(types.ToolListChangedNotification())
        return "reshaped"

    return server


async def test_a_tool_whose_schema_its_upstream_changes_takes_arguments_by_the_new_schema() -> None:
    # Arguments are checked against each tool's schema, compiled at its first call and kept
    # while its upstream lists nothing new: a relisting upstream's own must be compiled again.
    # (Pinning "warn" serves the changed tool; "hold" would withhold it.)
    async with (
        serving_upstream(reshaping_server()) as url,
        running_gateway({"upstreams": {"s": {"url": url}}, "pinning": "warn"}) as gw,
        Client(gw.url, mode="auto") as client,
    ):
        assert text_of(await client.call_tool("s__put", {"a": 1})) == "put 1"  # its check compiled
        async with client.listen(tools_list_changed=True) as subscription:
            assert text_of(await client.call_tool("s__reshape", {})) == "reshaped"
            with anyio.fail_after(10):
                await subscription.__anext__()
        assert text_of(await client.call_tool("s__put", {"a": "one"})) == "put one"


async def test_a_crashing_stdio_upstream_fails_the_call_at_once_and_is_restarted() -> None:
    config = {"upstreams": {"counter": python_upstream("counter.py", timeout=60)}}
    async with running_gateway(config) as gw, Client(gw.url) as client:
        first_pid = int(text_of(await client.call_tool("counter__pid", {})))
        first_up = gw.gateway.pool.get("counter").up_since
        started = time.monotonic()
        crashed = await client.call_tool("counter__crash", {})
        assert crashed.is_error
        assert "upstream 'counter'" in text_of(crashed)
        assert time.monotonic() - started < 5  # not the 60 s timeout
        upstream = gw.gateway.pool.get("counter")
        await wait_until(lambda: upstream.state == "up" and upstream.up_since != first_up, 20)
        second_pid = int(text_of(await client.call_tool("counter__pid", {})))
    assert second_pid != first_pid
    assert not pid_alive(first_pid)


async def test_a_hung_call_times_out_naming_the_upstream_while_others_keep_working() -> None:
    gate = anyio.Event()
    async with serving_upstream(gated_server(gate)) as url:
        config = {"upstreams": {"slow": {"url": url, "timeout": 1}, "counter": python_upstream("counter.py")}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            outcome: dict[str, types.CallToolResult] = {}

            async def hang() -> None:
                outcome["hung"] = await client.call_tool("slow__wait", {})

            async with anyio.create_task_group() as tg:
                tg.start_soon(hang)
                for _ in range(5):
                    assert not (await client.call_tool("counter__increment", {})).is_error
            gate.set()
    hung = outcome["hung"]
    assert hung.is_error
    assert "upstream 'slow'" in text_of(hung)
    assert "no answer within 1s" in text_of(hung)


async def test_stdio_children_are_reaped_when_the_gateway_stops() -> None:
    # The server exits on end of input by itself; the shell around it only when stopped.
    config = {"upstreams": {"counter": outliving_its_input(python_upstream("counter.py"))}}
    before = set(child_pids())
    async with running_gateway(config) as gw, Client(gw.url) as client:
        pid = int(text_of(await client.call_tool("counter__pid", {})))
        started = set(child_pids()) - before
        assert pid_alive(pid)
        assert len(started) == 1  # the shell, the server's parent
    await wait_until(lambda: not any(pid_alive(p) for p in {pid, *started}), 10)


async def test_a_handshake_era_http_session_is_ended_upstream_when_the_gateway_stops() -> None:
    # The transport closes by the gateway's cancel, which cancelled its DELETE too: each stop
    # (a deploy, a restart) left every HTTP upstream holding the gateway's session until the
    # upstream's own idle timeout (FastMCP has none). The official client sends its DELETE.
    server = FastMCP("held")
    server.tool(lambda: "pong", name="ping")
    app = server.http_app(path="/mcp")
    named: list[tuple[str, str | None]] = []

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            named.append(
                (scope["method"], dict(scope["headers"]).get(b"mcp-session-id", b"").decode() or None)
            )
        await app(scope, receive, send)

    async with serving(recording) as base:
        config = {"upstreams": {"held": {"url": f"{base}/mcp", "protocol": "legacy"}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            assert text_of(await client.call_tool("held__ping", {})) == "pong"
            used = {session for method, session in named if method == "POST" and session}
        ended = [session for method, session in named if method == "DELETE"]
    assert len(used) == 1
    assert ended == list(used)


async def test_each_upstream_is_logged_as_it_starts_and_when_it_is_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent_gateway")
    config = {"upstreams": {"counter": python_upstream("counter.py")}}
    async with running_gateway(config):
        pass
    said = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.catalog"]
    assert "catalog ready: 4 tools, 0 prompts, 0 resources, 0 templates from 1 upstream" in said
    lines = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.upstreams.connection"]
    starting = next(i for i, line in enumerate(lines) if line.startswith("starting counter ("))
    assert "counter.py)" in lines[starting]
    ready = [line for line in lines[starting:] if line.startswith("counter ready: ")]
    assert len(ready) == 1
    assert re.fullmatch(
        r"counter ready: 4 tools, 0 prompts, 0 resources, 0 templates in \d+\.\d s \(protocol .+\)",
        ready[0],
    )


async def test_the_ready_line_counts_what_is_served_tools_after_exclusion_and_templates_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It said "3 tools" for an upstream with one of its 3 excluded (2 served), "3 resources"
    # for 2 resources and a template, and "1 prompts".
    server = FastMCP("notes")
    for name in ("add", "search", "word_count"):
        server.tool(lambda: "ok", name=name)
    server.prompt(lambda: "hello", name="greet")
    server.resource("notes://one", name="one")(lambda: "1")
    server.resource("notes://two", name="two")(lambda: "2")
    server.resource("notes://{name}", name="note")(lambda name: name)
    caplog.set_level(logging.INFO, logger="agent_gateway.upstreams")
    async with serving_upstream(server) as url:
        config = {"upstreams": {"notes": {"url": url, "exclude": ["word_count"]}}}
        async with running_gateway(config) as gw, Client(gw.url) as client:
            served = {t.name for t in (await client.list_tools()).tools if t.name.startswith("notes__")}
    assert served == {"notes__add", "notes__search"}
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notes ready: ")]
    assert len(ready) == 1
    assert re.fullmatch(
        r"notes ready: 2 tools \(1 excluded\), 1 prompt, 2 resources, 1 template in \d+\.\d s \(protocol .+\)",
        ready[0],
    )


def test_an_upstreams_url_is_logged_without_credentials_or_query() -> None:
    config = config_of({"upstreams": {"s": {"url": "https://user:pw@example.com:8443/mcp?api_key=k"}}})
    assert describe_target(config.upstreams["s"]) == "https://***@example.com:8443/mcp?api_key=***"


async def test_a_stdio_upstream_gets_proxy_ca_and_npm_settings_and_what_passthrough_names_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = {
        "HTTPS_PROXY": "http://proxy.example:3128",
        "NO_PROXY": "127.0.0.1,localhost",
        "NODE_EXTRA_CA_CERTS": "/etc/ssl/corporate.pem",
        "npm_config_registry": "https://npm.example/",
        "TEAM_REGION": "eu",
        "EXTRA_ONE": "1",
        "UNRELATED_SECRET": "s3cret",
    }
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    config = {
        "env_passthrough": ["TEAM_*"],
        "upstreams": {"env": python_upstream("environ.py", env_passthrough=["EXTRA_ONE"], env={"OWN": "x"})},
    }
    async with running_gateway(config) as gw, Client(gw.url, mode="legacy") as client:
        result = await client.call_tool("env__environment", {})
    seen = result.structured_content
    assert seen is not None
    for name in (
        "HTTPS_PROXY",
        "NO_PROXY",
        "NODE_EXTRA_CA_CERTS",
        "npm_config_registry",
        "TEAM_REGION",
        "EXTRA_ONE",
    ):
        assert seen.get(name) == given[name], name
    assert seen["OWN"] == "x"
    assert "UNRELATED_SECRET" not in seen
