"""``ask_agent`` reads what its tools' results link to (``read_resource``) as its client would:
under the client's policy, through the gateway's own path; the upstream records each read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from mcp import Client

from agent_gateway.agent.results import LINKS, MAX_RESULT_CHARS, artifact
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.agent.test_agent_control import approving
from tests.agent.test_models import said, sampling_script
from tests.support import RunningGateway, running_gateway, serving, serving_upstream
from tests.test_access import client_with
from tests.test_resource_links import linker, other

BOUND = 20.0
NARROW = "n" * 32
REPORT = "linker+made://report/1"
"""The link ``linker__make`` gives to a report it lists nowhere, as the gateway makes it public."""


@asynccontextmanager
async def linked_agent(
    reads: list[str], model: ScriptedChatModel | None, agent: dict[str, Any] | None = None, **config: Any
) -> AsyncIterator[RunningGateway]:
    """A gateway over ``linker`` and ``other`` whose agent's model is ``model`` (None: the
    client's own, through sampling), its ``agent`` settings added."""
    agent = {"memory": {"store": "memory"}, "max_tools": 2, **(agent or {})}
    async with (
        serving(linker(reads).streamable_http_app()) as base,
        serving_upstream(other()) as second,
    ):
        upstreams = {"linker": {"url": f"{base}/mcp"}, "other": {"url": second}}
        async with running_gateway(
            {"upstreams": upstreams, "agent": agent, **config}, chat_model=model
        ) as gw:
            yield gw


def reading(*uris: str) -> Any:
    """A model turn that reads ``uris``, or (none given) the report its last turn was linked to."""

    async def turn(messages: list[BaseMessage]) -> AIMessage:
        linked = [m.text for m in messages if isinstance(m, ToolMessage) and "[resource link: " in m.text]
        links = uris or tuple(
            line[len("[resource link: ") : -1] for line in linked[-1].splitlines() if "made://report" in line
        )
        return calls(*(call("read_resource", uri=uri) for uri in links))

    return turn


def tool_texts(model: ScriptedChatModel, turn: int) -> list[str]:
    """The tool results the model was sent at its ``turn``th call (from 0)."""
    return [m.text for m in model.seen[turn] if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_agent_reads_the_resource_a_tools_result_links_to(mode: str) -> None:
    reads: list[str] = []
    model = ScriptedChatModel(script=[calls(call("linker__make")), reading(), answer("The report is read.")])
    async with linked_agent(reads, model) as gw, Client(gw.url, mode=mode) as client:
        with anyio.fail_after(BOUND):
            result = await client.call_tool("ask_agent", {"query": "Make the report and read it."})
        made = [(c.method, c.name, c.upstream, c.outcome) for c in gw.gateway.activity.calls if c.run]
    out = result.structured_content or {}
    assert not result.is_error, result.content
    # Recorded as the client's own read would be (the access log, the audit trail), with the run.
    assert made == [
        ("tools/call", "linker__make", "linker", "ok"),
        ("resources/read", REPORT, "linker", "ok"),
    ]
    # Before: "Unknown tool 'read_resource'", and the upstream never asked.
    assert reads == ["made://report/1"]
    assert tool_texts(model, 2)[-1] == "linker's made://report/1"
    # Offered from the turn after a result linked to a resource, not before; within max_tools.
    assert "read_resource" not in model.bound[0]
    assert "read_resource" in model.bound[1], model.bound
    assert len(model.bound[1]) == 2, model.bound
    assert [(c["name"], c["arguments"], c["is_error"]) for c in out["tool_calls"]] == [
        ("linker__make", {}, False),
        ("read_resource", {"uri": REPORT}, False),
    ]
    assert "read_resource" in out["offered_tools"]["names"]


async def test_the_agent_reads_only_what_its_clients_policy_allows() -> None:
    reads: list[str] = []
    auth = {
        "mode": "bearer",
        "tokens": [{"name": "narrow", "token": NARROW, "policy": "narrow"}],
        "policies": {"narrow": {"tools": ["linker__make", "ask_agent"], "resources": ["solo://*"]}},
    }
    model = ScriptedChatModel(
        script=[calls(call("linker__make")), reading(REPORT, "solo://a", ""), answer("Read what I may.")]
    )
    async with linked_agent(reads, model, auth=auth) as gw, client_with(gw.url, NARROW) as client:
        with anyio.fail_after(BOUND):
            result = await client.call_tool("ask_agent", {"query": "Make the report and read it."})
    out = result.structured_content or {}
    assert not result.is_error, result.content
    refused, allowed, empty = tool_texts(model, 2)[-3:]
    assert refused == f"Resource not found: {REPORT!r}"  # as the client's own read is answered
    assert allowed == "linker's solo://a"
    assert empty == 'read_resource takes {"uri": string}: the URI a resource link gives.'
    assert [c["is_error"] for c in out["tool_calls"]][1:] == [True, False, True]
    assert reads == ["solo://a"]


async def test_the_agent_reads_only_what_a_result_linked_to() -> None:
    # A result's words could ask the model to read what its client may read and pass it on
    # (to another tool): only URIs a result gave as resource links are read, and a link is
    # kept beside the result's text, not read back out of it.
    reads: list[str] = []
    unlinked = "linker+made://report/2"
    model = ScriptedChatModel(
        script=[calls(call("linker__make")), reading(unlinked, "solo://a"), answer("Read the linked one.")]
    )
    async with linked_agent(reads, model) as gw, Client(gw.url, mode="legacy") as client:
        with anyio.fail_after(BOUND):
            result = await client.call_tool("ask_agent", {"query": "Read report 2."})
    assert not result.is_error, result.content
    assert tool_texts(model, 2)[-2:] == [
        f"read_resource reads what a tool's result linked to; no result linked to {unlinked!r}.",
        "linker's solo://a",
    ]
    assert reads == ["solo://a"]


def test_a_results_links_are_kept_within_the_models_reading() -> None:
    # Kept beside the text in the thread, a result's links are bounded as its text is.
    links = [f"x://{n:06d}" for n in range(20_000)]  # 10 characters each, 200,000 in all
    kept = artifact(links)
    assert kept is not None
    assert kept[LINKS] == links[: MAX_RESULT_CHARS // 10]
    assert artifact([]) is None


async def test_a_client_model_in_the_json_envelope_reads_a_link_it_is_shown() -> None:
    # The sampling provider describes only the bound tools: read_resource among them once a
    # result linked to a resource, in the envelope's own words.
    reads: list[str] = []
    seen: list[types.CreateMessageRequestParams] = []
    replies = [
        said('{"type": "tool_call", "name": "linker__make", "args": {}}'),
        said(f'{{"type": "tool_call", "name": "read_resource", "args": {{"uri": "{REPORT}"}}}}'),
        said('{"type": "final", "content": "read"}'),
    ]
    async with (
        linked_agent(reads, None) as gw,
        Client(gw.url, mode="legacy", sampling_callback=sampling_script(replies, seen)) as client,
    ):
        with anyio.fail_after(BOUND):
            result = await client.call_tool("ask_agent", {"query": "Make the report and read it."})
    assert not result.is_error, result.content
    assert reads == ["made://report/1"]
    prompts = [p.system_prompt or "" for p in seen]
    assert "- read_resource:" not in prompts[0]
    assert "- read_resource: Read a resource by its URI" in prompts[1]
    last = seen[2].messages[-1].content
    assert isinstance(last, types.TextContent)
    assert last.text == "Tool read_resource returned:\nlinker's made://report/1"


def web() -> FastMCP:
    """An upstream serving a web address as its own resource (a fetcher, a vault behind https)."""
    server = FastMCP("web")
    server.resource("https://example.org/report", name="report")(lambda: "web's private report")
    return server


async def test_a_web_link_is_not_read_from_another_upstream() -> None:
    # linker's make links to https://example.org/report, kept as it is (a web address): the
    # catalog serves that URI as web's. A link from one upstream must not have the agent read
    # another's resource (its words would choose which, and pass it on to linker's tools).
    reads: list[str] = []
    model = ScriptedChatModel(
        script=[calls(call("linker__make")), reading("https://example.org/report"), answer("Done.")]
    )
    agent = {"memory": {"store": "memory"}, "max_tools": 2}
    async with (
        serving(linker(reads).streamable_http_app()) as base,
        serving_upstream(web()) as second,
    ):
        upstreams = {"linker": {"url": f"{base}/mcp"}, "web": {"url": second}}
        async with (
            running_gateway({"upstreams": upstreams, "agent": agent}, chat_model=model) as gw,
            Client(gw.url, mode="legacy") as client,
        ):
            with anyio.fail_after(BOUND):
                result = await client.call_tool("ask_agent", {"query": "Make the report and read it."})
    assert not result.is_error, result.content
    read = tool_texts(model, 2)[-1]
    assert "web's private report" not in read
    assert read == "Resource not found: 'https://example.org/report'"


@pytest.mark.parametrize(
    ("agent", "said_to_model"),
    [
        ({"tools": {"exclude": ["read_resource"]}}, "Unknown tool 'read_resource'. The tools are:"),
        ({"require_approval": ["read_resource"]}, "The user declined to run read_resource."),
    ],
    ids=["excluded", "approval"],
)
async def test_an_operator_turns_reading_off_or_has_it_approved(
    agent: dict[str, Any], said_to_model: str
) -> None:
    reads: list[str] = []
    asked: list[str] = []
    model = ScriptedChatModel(script=[calls(call("linker__make")), reading(REPORT), answer("Not read.")])
    async with (
        linked_agent(reads, model, agent) as gw,
        Client(gw.url, mode="legacy", elicitation_callback=approving("decline", asked)) as client,
    ):
        with anyio.fail_after(BOUND):
            result = await client.call_tool("ask_agent", {"query": "Make the report and read it."})
    assert not result.is_error, result.content
    assert tool_texts(model, 2)[-1].startswith(said_to_model)
    excluded = "exclude" in agent.get("tools", {})
    assert ("read_resource" in model.bound[1]) is not excluded  # offered only where it may be called
    assert len(asked) == (0 if excluded else 1)
    assert reads == []
