"""An upstream's tool schema never makes the gateway fetch anything, nor a client's value
stall it.

A ``$ref`` to a URL in an input schema made ``jsonschema`` fetch it (with a deprecation
warning) on the first call that reached it: any upstream could make the gateway send
requests to an address of its choosing (a metadata service, an internal API), and read
part of the answer back through the validation error. Now a reference outside the schema
is not followed: the value is left to the upstream to judge, as with a broken schema.

A ``pattern`` with nested quantifiers (``^(a+)+$``) took Python's backtracking ``re`` time
doubling with each character of a value that fails it: 40 characters from one client held
the event loop (and the GIL) for hours, for every client. Patterns are matched within a time
budget now, and a value whose patterns spend it is left to the upstream.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any, ClassVar

import anyio
import mcp_types as types
import pytest
from fastmcp import FastMCP
from fastmcp.tools import Tool, ToolResult
from mcp import Client
from pydantic import Field

from tests.support import gateway_process, running_gateway, serving_upstream


class _SchemaHost(BaseHTTPRequestHandler):
    """Serves a schema that would reject the calls below, and records every fetch."""

    fetched: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.fetched.append(self.path)
        body = json.dumps({"type": "string", "maxLength": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _schema_host() -> Iterator[tuple[str, list[str]]]:
    """On a thread of its own: a gateway that fetched synchronously would block its event
    loop, and so a host served there, until the test timed out instead of failing."""
    fetched: list[str] = []
    handler = type("Recording", (_SchemaHost,), {"fetched": fetched})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", fetched
        finally:
            server.shutdown()
            thread.join(5)


class _Recorded(Tool):
    """A tool listed with the schema it is given (FastMCP would drop a remote ``$ref`` from
    its ``parameters``), recording the arguments it receives."""

    calls: list[dict[str, Any]]
    listed_schema: dict[str, Any]

    def to_mcp_tool(self, **overrides: Any) -> types.Tool:
        return super().to_mcp_tool(**{"inputSchema": self.listed_schema, **overrides})

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append(arguments)
        return ToolResult(
            content=[types.TextContent(type="text", text=json.dumps(arguments, sort_keys=True))]
        )


@asynccontextmanager
async def _upstream_referring_to(
    url: str, defs: dict[str, Any] | None = None
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    server = FastMCP("refs")
    schema = {
        "type": "object",
        "properties": {"name": {"$ref": url}, "count": {"type": "integer"}},
        "required": ["name"],
        **({"$defs": defs} if defs is not None else {}),
    }
    tool = _Recorded(
        name="lookup", description="Looks a name up", parameters=schema, listed_schema=schema, calls=[]
    )
    server.add_tool(tool)
    async with serving_upstream(server) as upstream:
        yield upstream, tool.calls


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_remote_ref_in_an_input_schema_is_not_fetched(mode: str) -> None:
    with _schema_host() as (host, fetched):
        async with (
            _upstream_referring_to(f"{host}/name.json") as (upstream, calls),
            running_gateway({"upstreams": {"refs": {"url": upstream}}}) as gw,
            Client(gw.url, mode=mode) as client,
        ):
            result = await client.call_tool("refs__lookup", {"name": "Ada Lovelace", "count": 2})
    assert fetched == []  # with the fetch, the served schema rejected the call (maxLength 1)
    assert not result.is_error
    assert calls == [{"name": "Ada Lovelace", "count": 2}]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_ref_within_the_schema_is_followed(mode: str) -> None:
    defs = {"name": {"type": "string", "maxLength": 5}}
    async with (
        _upstream_referring_to("#/$defs/name", defs) as (upstream, calls),
        running_gateway({"upstreams": {"refs": {"url": upstream}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        too_long = await client.call_tool("refs__lookup", {"name": "Ada Lovelace"})
        fine = await client.call_tool("refs__lookup", {"name": "Ada", "count": 1})
    assert too_long.is_error
    assert "name: 'Ada Lovelace' is too long" in str(too_long.content[0])
    assert not fine.is_error
    assert calls == [{"name": "Ada", "count": 1}]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_ref_that_resolves_nowhere_leaves_the_arguments_to_the_upstream(mode: str) -> None:
    async with (
        _upstream_referring_to("#/$defs/missing") as (upstream, calls),
        running_gateway({"upstreams": {"refs": {"url": upstream}}}) as gw,
        Client(gw.url, mode=mode) as client,
    ):
        result = await client.call_tool("refs__lookup", {"name": "Ada", "count": "two"})
    assert not result.is_error  # as with a broken schema: the upstream judges
    assert calls == [{"name": "Ada", "count": "two"}]


def _speller() -> FastMCP:
    server = FastMCP("words")

    @server.tool
    def spell(word: Annotated[str, Field(pattern=r"^(a+)+$")]) -> str:
        return word

    @server.tool
    def stammer(word: Annotated[str, Field(pattern=r"^(a|aa)+$")]) -> str:
        return word  # a pattern the gateway cannot decide within its budget: this one judges

    @server.tool
    def echo(text: str) -> str:
        return text

    tally = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    # A subschema naming its own draft (here the root, through "#") is checked by jsonschema's
    # stock class for that draft: bounded too.
    nest = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"w": {"type": "string", "pattern": "^(a+)+$"}, "child": {"$ref": "#"}},
    }
    for name, schema in (("tally", tally), ("nest", nest)):
        server.add_tool(_Recorded(name=name, parameters=schema, listed_schema=schema, calls=[]))
    return server


EVIL = "a" * 40 + "!"


ATTACKS = [
    ("words__spell", {"word": EVIL}, "does not match '^(a+)+$'"),  # a value
    ("words__tally", {EVIL: 1}, "does not match any of the regexes: '^(a+)+$'"),  # a property name
    ("words__nest", {"child": {"w": EVIL}}, "does not match '^(a+)+$'"),  # in a subschema of its own draft
    (
        "words__stammer",
        {"word": EVIL},
        "String should match pattern '^(a|aa)+$'",
    ),  # undecided: the upstream's words
]
"""Each place a pattern is matched: the tool called, its arguments, and what the refusal says."""


async def test_a_value_against_a_backtracking_pattern_stalls_no_one(tmp_path: Path) -> None:
    # One gateway process for every attack (each was a case of its own, a process start each):
    # each attack is still made and checked alone, a bystander served beside it.
    async with (
        serving_upstream(_speller()) as upstream,
        # Its own process, as deployed: a stalled gateway must not stall the test's bounds.
        gateway_process({"upstreams": {"words": {"url": upstream}}}, tmp_path) as base,
        Client(f"{base}/mcp") as attacker,
        Client(f"{base}/mcp") as bystander,
    ):
        for tool, arguments, error in ATTACKS:
            await _attack_beside(bystander, attacker, tool, arguments, error)


async def _attack_beside(
    bystander: Client, attacker: Client, tool: str, arguments: dict[str, Any], error: str
) -> None:
    served: list[str] = []

    async def attack() -> None:
        result = await attacker.call_tool(tool, arguments)
        assert result.is_error, tool
        assert error in str(result.content[0]), tool

    async def go_about_ones_business() -> None:
        for n in range(5):
            served.append(text_of(await bystander.call_tool("words__echo", {"text": f"call {n}"})))

    with anyio.fail_after(60):  # before: the attacker's check alone ran for hours
        async with anyio.create_task_group() as tg:
            tg.start_soon(attack)
            tg.start_soon(go_about_ones_business)
    assert served == [f"call {n}" for n in range(5)], tool
    assert text_of(await attacker.call_tool("words__spell", {"word": "aaa"})) == "aaa", tool


def text_of(result: types.CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return first.text
