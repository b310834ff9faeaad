"""The agent over a thousand tools: each model call is offered at most ``agent.max_tools``, chosen
by relevance, and the model finds the others with ``search_tools``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
from fastmcp import FastMCP
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from mcp import Client

from agent_gateway.access import OPERATOR
from tests.agent.model_apis import OPENAI_MAX_TOOLS, Script, ScriptedApi, Turn, openai_api
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_ask_agent import ask, record, text
from tests.agent.test_models import openai_model, said, sampling_script
from tests.security.test_search_attacks import wide_server
from tests.servers import many_tools
from tests.support import RunningGateway, running_gateway, serving, serving_upstream

ACK = "many__oncall_acknowledge_incident"


@asynccontextmanager
async def big_gateway(
    model: dict[str, Any] | None, calls: list[tuple[str, dict[str, Any]]], **agent: Any
) -> AsyncIterator[RunningGateway]:
    config = {"memory": {"store": "memory"}, **agent}
    if model is not None:
        config["model"] = model
    async with (
        serving_upstream(many_tools.build(calls)) as url,
        running_gateway({"upstreams": {"many": {"url": url}}, "agent": config}) as gw,
    ):
        assert len(gw.gateway.catalog.snapshot.tools) == many_tools.TOOL_COUNT > 1000
        yield gw


async def asked_vaguely(
    turns: Sequence[Script], request: str = "Please deal with what Sam mentioned in standup"
) -> tuple[ScriptedApi, list[tuple[str, dict[str, Any]]], types.CallToolResult]:
    """``request`` (by default one that names no tool), over the thousand tools with 12 bound
    per model call: the scripted endpoint, the calls the upstream received, and the answer."""
    app, api = openai_api(turns)
    calls: list[tuple[str, dict[str, Any]]] = []
    async with (
        serving(app) as base,
        big_gateway(openai_model(base), calls, max_tools=12) as gw,
        Client(gw.url) as client,
    ):
        result = await ask(client, request)
    return api, calls, result


def offered(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


async def test_a_run_over_a_thousand_tools_binds_the_relevant_ones_and_calls_the_right_tool() -> None:
    def first(body: dict[str, Any]) -> Turn:
        assert ACK in offered(body), offered(body)  # chosen from the request's own words
        return Turn(calls=[(ACK, {"id": "INC-7"})])

    app, api = openai_api([first, Turn(text="Acknowledged INC-7.")])
    calls: list[tuple[str, dict[str, Any]]] = []
    async with serving(app) as base, big_gateway(openai_model(base), calls) as gw, Client(gw.url) as client:
        result = await ask(client, "Acknowledge incident INC-7 so the responders stop getting paged")
    assert not result.is_error, text(result)
    assert calls == [("oncall_acknowledge_incident", {"id": "INC-7"})]
    for body in api.requests:
        names = offered(body)
        assert len(names) <= 40 <= OPENAI_MAX_TOOLS  # agent.max_tools: up to 39 chosen, and search_tools
        assert names[-1] == "search_tools"
    out = record(result)
    assert 2 <= out["offered_tools"]["count"] <= 40
    assert {ACK, "search_tools"} <= set(out["offered_tools"]["names"])  # as the model was offered them


async def test_a_tool_the_request_does_not_name_is_found_by_the_models_own_search() -> None:
    def search_first(body: dict[str, Any]) -> Turn:
        assert ACK not in offered(body)
        return Turn(calls=[("search_tools", {"query": "acknowledge an incident"})])

    def then_call(body: dict[str, Any]) -> Turn:
        assert ACK in offered(body), offered(body)  # offered once the model found it
        assert len(offered(body)) <= 12
        return Turn(calls=[(ACK, {"id": "INC-9"})])

    api, calls, result = await asked_vaguely([search_first, then_call, Turn(text="Done.")])
    assert not result.is_error, text(result)
    assert calls == [("oncall_acknowledge_incident", {"id": "INC-9"})]
    searched = api.requests[1]["messages"][-1]
    assert searched["role"] == "tool"
    assert ACK in searched["content"]
    assert [c["name"] for c in record(result)["tool_calls"]] == ["search_tools", ACK]


async def test_a_tool_found_by_search_displaces_the_least_relevant_of_a_full_offer() -> None:
    # The request matches more tools than a call is offered: what the model finds must come
    # first, or merged after a full offer it is cut off and never offered at all.
    first: list[str] = []

    def search_first(body: dict[str, Any]) -> Turn:
        first.extend(offered(body))
        assert len(first) == 12, first  # 11 chosen, and search_tools: full
        assert ACK not in first
        return Turn(calls=[("search_tools", {"query": "acknowledge an incident", "limit": 1})])

    def then_call(body: dict[str, Any]) -> Turn:
        assert offered(body) == [ACK, *first[:10], "search_tools"], offered(body)
        return Turn(calls=[(ACK, {"id": "INC-4"})])

    api, calls, result = await asked_vaguely(
        [search_first, then_call, Turn(text="Done.")], "Export the billing reports"
    )
    assert not result.is_error, text(result)
    assert calls == [("oncall_acknowledge_incident", {"id": "INC-4"})]
    assert len(api.requests) == 3


async def test_the_models_searches_with_a_whole_float_limit_or_bad_arguments_keep_the_run_going() -> None:
    turns: list[Turn] = [
        Turn(calls=[("search_tools", {"query": "acknowledge an incident", "limit": 5.0})]),
        Turn(calls=[("search_tools", {"query": " "})]),
        Turn(calls=[(ACK, {"id": "INC-3"})]),
        Turn(text="Done."),
    ]
    api, calls, result = await asked_vaguely(turns)
    assert not result.is_error, text(result)
    assert calls == [("oncall_acknowledge_incident", {"id": "INC-3"})]
    assert ACK in api.requests[1]["messages"][-1]["content"]  # 5.0 is the integer 5
    assert "query: must not be empty" in api.requests[2]["messages"][-1]["content"]
    recorded = [(c["name"], c["is_error"]) for c in record(result)["tool_calls"]]
    assert recorded == [("search_tools", False), ("search_tools", True), (ACK, False)]


async def test_without_the_bound_every_tool_would_be_refused_by_the_model_api() -> None:
    """The endpoint refuses over 128 tools as OpenAI does: the bound is what keeps runs alive."""
    app, api = openai_api([Turn(text="unused")])
    calls: list[tuple[str, dict[str, Any]]] = []
    async with serving(app) as base, big_gateway(openai_model(base), calls) as gw, Client(gw.url) as client:
        toolbox, _ = gw.gateway.agent.toolbox(OPERATOR)  # type: ignore[union-attr]
        body = {"tools": [t.spec for n in gw.gateway.catalog.snapshot.tools if (t := toolbox.get(n))]}
        assert len(body["tools"]) > OPENAI_MAX_TOOLS
        result = await ask(client, "What is the weather forecast for Oslo?")
    assert not result.is_error, text(result)
    assert offered(api.requests[0]) == ["many__weather_forecast", "search_tools"]  # only what matches


async def test_a_client_model_is_described_only_the_bound_tools_in_the_envelope() -> None:
    seen: list[types.CreateMessageRequestParams] = []
    replies = [
        said(f'{{"type": "tool_call", "name": "{ACK}", "args": {{"id": "INC-1"}}}}'),
        said('{"type": "final", "content": "Acknowledged."}'),
    ]
    calls: list[tuple[str, dict[str, Any]]] = []
    async with (
        big_gateway(None, calls, max_tools=10) as gw,
        Client(gw.url, mode="legacy", sampling_callback=sampling_script(replies, seen)) as client,
    ):
        result = await ask(client, "acknowledge the incident INC-1")
    # The seed protocol's spellings (name/args, content) are understood without a correction.
    assert not result.is_error, text(result)
    assert text(result) == "Acknowledged."
    assert len(seen) == 2
    assert calls == [("oncall_acknowledge_incident", {"id": "INC-1"})]
    prompt = seen[0].system_prompt or ""
    described = [line for line in prompt.splitlines() if line.startswith("- ")]
    assert 2 <= len(described) <= 10  # up to 9 chosen, and search_tools: not a thousand
    assert described[0].startswith(f"- {ACK}:")
    assert described[-1].startswith("- search_tools:")


async def test_an_upstream_tool_named_search_tools_never_stands_beside_the_agents_own() -> None:
    # With search off and an upstream unprefixed, a catalog tool could take the name the agent
    # gives its own search: the model was bound two functions of one name (model APIs refuse
    # that), and each call of it went to the gateway's search. The name is the gateway's.
    docs = FastMCP("docs")
    docs.tool(lambda query: f"hits for {query}", name="search_tools", description="Search the docs' tools.")
    for i in range(12):
        docs.tool(lambda: "ok", name=f"page_{i}", description=f"Read documentation page {i}.")
    app, api = openai_api([Turn(text="done")])
    async with serving(app) as base, serving_upstream(docs) as url:
        config = {
            "upstreams": {"docs": {"url": url, "prefix": False}},
            "search": {"mode": "off"},
            "agent": {"memory": {"store": "memory"}, "max_tools": 5, "model": openai_model(base)},
        }
        async with running_gateway(config) as gw, Client(gw.url) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            result = await ask(client, "read the documentation pages")
    assert not result.is_error, text(result)
    assert "search_tools" not in listed
    assert "page_0" in listed
    names = offered(api.requests[0])
    assert (len(names), names.count("search_tools")) == (5, 1)


async def test_a_runs_record_lists_at_most_256_of_the_tools_it_was_offered_and_counts_them_all(
    tmp_path: Path,
) -> None:
    # Each turn's search finds another service's tools: the record listed every tool offered
    # in the run (100 turns of 127 new ones would be 12,700 names, 850 KB).
    searches = [
        calls(call("search_tools", query=f"{service} {verb}", limit=50))
        for service in many_tools.SERVICES[:5]
        for verb in ("create", "export")
    ]
    model = ScriptedChatModel(script=[*searches, answer("Looked around.")])
    stored = tmp_path / "conversations.sqlite"
    agent = {"memory": {"store": "sqlite", "path": str(stored)}, "max_tools": 128, "max_steps": 12}
    async with (
        serving_upstream(many_tools.build([])) as url,
        running_gateway({"upstreams": {"many": {"url": url}}, "agent": agent}, chat_model=model) as gw,
        Client(gw.url) as client,
    ):
        result = await ask(client, "Look at every service")
    assert not result.is_error, text(result)
    offered = record(result)["offered_tools"]
    assert offered["count"] > 256, offered["count"]
    assert len(offered["names"]) == 256
    assert len(set(offered["names"])) == 256
    # The stored state, read back from the database, holds what the record lists, no more
    # (it is written at every step: it held every name offered, up to 12,700).
    async with AsyncSqliteSaver.from_conn_string(str(stored)) as saver:
        (latest,) = [c async for c in saver.alist(None, limit=1)]
    state = latest.checkpoint["channel_values"]
    assert state["offered_seen"] == offered["names"]
    assert state["offered_count"] == offered["count"]
    assert len(state["offered_last"]) <= 128


async def test_a_model_call_is_offered_the_best_tools_whose_definitions_fit_and_finds_the_rest() -> None:
    # Twenty tools of ~40 KB schemas (real ones reach 268 KB): all 20 offered made a model call
    # of 0.9 MB (of 260 KB ones, 10 MB: past any model's context window).
    def first(body: dict[str, Any]) -> Turn:
        assert 1 <= len(offered(body)) - 1 <= 3, offered(body)  # and search_tools
        assert "search_tools" in offered(body)
        assert len(json.dumps(body["tools"])) <= 128 * 1024 + 8_192  # search.tools.ANSWER_BYTES
        return Turn(calls=[("search_tools", {"query": "wide record tool 17"})])

    def second(body: dict[str, Any]) -> Turn:
        assert offered(body)[0] == "wide__wide_17", offered(body)  # found, offered first
        assert len(json.dumps(body["tools"])) <= 128 * 1024 + 8_192
        return Turn(calls=[("wide__wide_17", {})])

    app, api = openai_api([first, second, Turn(text="Done.")])
    async with (
        serving(app) as base,
        serving_upstream(wide_server()) as url,
        running_gateway({"upstreams": {"wide": {"url": url}}, "agent": {"model": openai_model(base)}}) as gw,
        Client(gw.url) as client,
    ):
        result = await ask(client, "Use the wide record tools")
    assert not result.is_error, text(result)
    assert [c["name"] for c in record(result)["tool_calls"]] == ["search_tools", "wide__wide_17"]
    assert len(api.requests) == 3
