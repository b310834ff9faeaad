"""Running one model turn's tool calls, concurrently, through the gateway's own proxy path, and
choosing the tools a model call is offered.

Every call goes through ``Proxy.call_tool`` under the client's session, so argument
validation, per-client upstream sessions, cancellation and timeouts are those of any other
call. A failing call is a result the model reads, never an exception out of the run.

A run holds one of its client's slots (``max_concurrency``), and its own calls take none, or a
run could be refused its calls by the client's other work: so they are bounded apart. Of one
turn at most ``MAX_CALLS_PER_TURN`` are run, and a client's runs have at most its
``max_concurrency`` calls in flight together (the rest wait for a slot). Before, one turn of
400 calls held 400 at once, every slot of the upstream, and other clients were refused. The
model's own ``search_tools`` calls are answered from the tool index, and what they find is
offered to the model from its next turn on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import anyio
import mcp_types as types
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    InvalidToolCall,
    ToolCall,
    ToolMessage,
)

from agent_gateway.access import Principal
from agent_gateway.agent.approvals import Proposed, refusals
from agent_gateway.agent.asking import Asker
from agent_gateway.agent.reporting import RunObserver, ToolCallRecord, recorded
from agent_gateway.agent.results import Linked, artifact, links_of, read_text, render
from agent_gateway.agent.run_record import refusal_of
from agent_gateway.agent.spans import tool_span
from agent_gateway.agent.toolbox import READ_RESOURCE, AgentTool, Search, Toolbox, merged, within_bytes
from agent_gateway.call_records import CallRecorder, RunCall
from agent_gateway.downstream.caller import Caller
from agent_gateway.errors import GatewayError, ModelFailed, shown
from agent_gateway.proxy import Proxy
from agent_gateway.search.engine import Found
from agent_gateway.search.tools import SEARCH_TOOLS, search_request

logger = logging.getLogger(__name__)

MAX_CALLS_PER_TURN = 32
"""Tool calls of one model turn that are run; the model is told the rest were not."""
MAX_CALLS_KEPT = 4 * MAX_CALLS_PER_TURN
"""Tool calls of one model turn kept in the conversation (those past ``MAX_CALLS_PER_TURN``
answered "Not run"); a reply asking for more is cut to these. A client's model answered one
turn with 10,000 calls: each was logged, answered and kept, and the next request built from
them held the event loop for 90 s."""
MAX_REPLY_CHARS = 500_000
MAX_NAME_CHARS = 128
"""The longest tool name or call id of a model's reply a run keeps (public names are at most 64)."""
"""Characters of one model reply (its text and its tool calls' arguments) a run takes; a
longer one ends the run. A client's model answered each of a run's ten turns with a call of
3.5 MB of arguments: every turn was kept whole, the run's record held them all, and one run
took 1.1 GB of memory and 446 MB of disk."""

Outcome = tuple[ToolMessage, ToolCallRecord]
_CONVERSATION_TURNS = 3
"""The user's latest messages that choose the tools a run starts with."""
_FOUND_PER_SEARCH = 10


@dataclass(frozen=True)
class ToolRunner:
    """Runs tool calls for one agent run."""

    toolbox: Toolbox
    proxy: Proxy
    recorder: CallRecorder
    """Where each call is recorded as the client's (the access log, the audit trail)."""
    run_id: str
    caller: Caller | None
    """The client's request, minus its progress token: the agent reports its own progress."""
    observer: RunObserver
    asker: Asker | None
    """Where approvals are asked (None: nowhere, so tools that need one are refused)."""
    approval_timeout: float = 300.0
    search: Search | None = None
    """The tool index (None: only what the toolbox offers from the start)."""
    names: Sequence[str] = ()
    """Every tool of a toolbox small enough to offer whole."""
    client: Principal | None = None
    """Whom the run is for: its calls are under that client's policy (None: refused)."""

    async def choose(self, history: Sequence[AnyMessage]) -> list[str]:
        """The tools a run's first model call is offered: all of a small toolbox, else the
        ``max_tools - 1`` most relevant to the user's latest messages."""
        if not self.toolbox.searching or self.search is None:
            return list(self.names)
        asked = [m.text for m in history if isinstance(m, HumanMessage)][-_CONVERSATION_TURNS:]
        keep = self.toolbox.config.max_tools - 1
        found = await self.search(" ".join(reversed(asked)), keep, None, self.toolbox.accepts)
        return within_bytes(self.toolbox, [f.tool.name for f in found])

    def widened(self, offered: Sequence[str], found: Sequence[str]) -> list[str]:
        """What the next model call is offered after a turn whose searches found ``found``."""
        if not found:
            return list(offered)
        return within_bytes(self.toolbox, merged(offered, found, self.toolbox.config.max_tools - 1))

    async def run(
        self,
        calls: Sequence[ToolCall],
        invalid: Sequence[InvalidToolCall] = (),
        linked: Linked | None = None,
    ) -> tuple[list[Outcome], list[str]]:
        """One outcome per call, in the model's order, and the tools its searches found; the
        calls run concurrently; ``read_resource`` reads only what a result ``linked`` to.

        Approvals are asked first, all at once: asking may pause the run (a modern client),
        and on resume this runs again from the start, so no tool may have run before it.
        """
        refused, linked = await self._approvals(calls), linked or {}
        outcomes: list[Outcome | None] = [None] * len(calls)
        found: list[list[str]] = [[] for _ in calls]

        async def one(index: int, call: ToolCall) -> None:
            if index >= MAX_CALLS_PER_TURN:
                outcomes[index] = await self._run_one(call, _TOO_MANY, linked)
            elif call["name"] == SEARCH_TOOLS and self.toolbox.searching:
                outcomes[index], found[index] = await self._search_one(call)
            else:
                outcomes[index] = await self._run_one(call, refused.get(_key(index)), linked)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(one, index, call)
        done = [o for o in outcomes if o is not None]
        return done + [_unparsable(call) for call in invalid], [n for names in found for n in names]

    async def _search_one(self, call: ToolCall) -> tuple[Outcome, list[str]]:
        """The model's ``search_tools`` call, answered from the index with what it may call."""
        started = time.perf_counter()
        failed = False
        try:
            request = search_request(call["args"])
        except GatewayError as exc:
            text, hits, failed = str(exc), [], True
        else:
            assert self.search is not None  # searching implies an index
            limit = min(request.limit or _FOUND_PER_SEARCH, self.toolbox.config.max_tools - 1)
            hits = await self.search(request.query, limit, request.upstream, self.toolbox.accepts)
            text = _found_text(request.query, hits)
        record = ToolCallRecord(
            name=SEARCH_TOOLS,
            arguments=recorded(call["args"]),
            is_error=failed,
            duration_ms=round((time.perf_counter() - started) * 1e3, 3),
        )
        message = ToolMessage(content=text, tool_call_id=call["id"] or SEARCH_TOOLS, name=SEARCH_TOOLS)
        return (message, record), [h.tool.name for h in hits]

    async def _approvals(self, calls: Sequence[ToolCall]) -> dict[str, str | None]:
        proposed: dict[str, Proposed] = {}
        for index, call in enumerate(calls[:MAX_CALLS_PER_TURN]):  # the rest are not run: not asked
            tool = self.toolbox.get(call["name"]) or self._reader(call["name"])
            if tool is not None and tool.needs_approval:
                proposed[_key(index)] = Proposed(tool, call["args"])
        return await refusals(proposed, self.asker, self.approval_timeout)

    async def _run_one(self, call: ToolCall, refused: str | None, linked: Linked) -> Outcome:
        name, arguments, links = call["name"], call["args"], list[str]()
        await self.observer.tool_started(name, arguments)
        started = time.perf_counter()
        tool = self.toolbox.get(name)
        with tool_span(name, tool.upstream if tool else None) as traced:
            if refused is _TOO_MANY:
                text, is_error = refused, True
            elif tool is None and self._reader(name) is not None:  # the gateway's own read_resource
                text, is_error = await self._read(arguments, linked, refused)
            else:
                text, is_error = await self._outcome(name, tool, arguments, refused, links)
            if is_error:
                traced.error_type = "tool_error"
        record = ToolCallRecord(
            name=name,
            arguments=recorded(arguments),
            is_error=is_error,
            duration_ms=round((time.perf_counter() - started) * 1e3, 3),
        )
        await self.observer.tool_finished(record)
        message = ToolMessage(
            content=text,
            tool_call_id=call["id"] or name,
            name=name,
            status="error" if is_error else "success",
            artifact=artifact(links, tool.upstream if tool else ""),  # beside the text its words make
        )
        return message, record

    async def _outcome(
        self,
        name: str,
        tool: AgentTool | None,
        arguments: dict[str, Any],
        refused: str | None,
        links: list[str],
    ) -> tuple[str, bool]:
        """The call's result for the model: ``tool`` is ``name`` in the toolbox (None: not
        there); ``refused``: why its approval was not given; ``links`` given what it links to."""
        if tool is None:
            if self.toolbox.searching:
                return f"Unknown tool {name!r}. Call {SEARCH_TOOLS} to find the tools you need.", True
            known = ", ".join(sorted(self.names)) or "none"
            return f"Unknown tool {name!r}. The tools are: {known}.", True
        call = RunCall(self.run_id, self.client, self.caller, name, tool.upstream, arguments)
        try:
            with self.recorder.run_call(call) as record:
                if refused is not None:  # the user declined it, or no one could be asked: recorded
                    record.outcome, record.detail = "refused", refused
                    return refused, True
                self.recorder.check_audited("tools/call")  # recorded as refused, as the client's would be
                async with _slots(self.client):
                    result = await self.proxy.call_tool(name, arguments, self.caller, self.client)
                record.answered(result)
                if isinstance(result, types.InputRequiredResult):  # never resumed: not "paused"
                    unanswered = f"Tool {name} asked for input from the user, which the agent cannot supply."
                    record.outcome, record.detail = "tool_error", unanswered
                    return unanswered, True
        except GatewayError as exc:
            return str(exc), True
        links += links_of(result)
        return render(result), bool(result.is_error)

    def _reader(self, name: str) -> AgentTool | None:
        """The gateway's ``read_resource``, if ``name`` is it and the run may call it."""
        return self.toolbox.reader() if name == READ_RESOURCE else None

    async def _read(self, arguments: dict[str, Any], linked: Linked, refused: str | None) -> tuple[str, bool]:
        """The model's ``read_resource`` call of a URI a result ``linked`` to: read as the
        client would read it (its policy, its session), recorded as its ``resources/read``, from
        an upstream that linked to it. No other: a result's words could ask the model to read
        what its client may, and pass it on."""
        uri = arguments.get("uri")
        if not isinstance(uri, str) or not uri:
            return f'{READ_RESOURCE} takes {{"uri": string}}: the URI a resource link gives.', True
        if uri not in linked:
            return f"{READ_RESOURCE} reads what a tool's result linked to; no result linked to {uri!r}.", True
        gave = next(iter(linked[uri])) if len(linked[uri]) == 1 else None  # the one it may reach
        call = RunCall(self.run_id, self.client, self.caller, uri, gave, arguments, "resources/read")
        try:
            with self.recorder.run_call(call) as record:
                if refused is not None:  # its approval not given: recorded, as a tool's is
                    record.outcome, record.detail = "refused", refused
                    return refused, True
                self.recorder.check_audited("resources/read")
                async with _slots(self.client):
                    read = await self.proxy.read_resource(uri, self.caller, self.client, linked[uri])
                record.answered(read)
                if isinstance(read, types.InputRequiredResult):
                    unanswered = (
                        f"Reading {uri} asked for input from the user, which the agent cannot supply."
                    )
                    record.outcome, record.detail = "tool_error", unanswered
                    return unanswered, True
        except GatewayError as exc:
            return str(exc), True
        return read_text(read), False


def taken(reply: AIMessage) -> AIMessage:
    """The model's ``reply`` as the run takes it: with at most ``MAX_CALLS_KEPT`` tool calls,
    valid ones first (the rest are cut from the conversation, the model's own view of its
    turn included).

    Raises:
        ModelFailed: its text (or refusal) and tool arguments hold more than ``MAX_REPLY_CHARS``.
    """
    reply = _names_cut(reply)
    calls, invalid = reply.tool_calls, reply.invalid_tool_calls
    size = (
        len(reply.text) + len(refusal_of(reply)) + sum(len(json.dumps(c["args"], default=str)) for c in calls)
    )
    size += sum(len(c.get("args") or "") for c in invalid)
    if size > MAX_REPLY_CHARS:
        raise ModelFailed(
            f"the model's reply holds {size:,} characters of text and tool arguments; "
            f"a run takes at most {MAX_REPLY_CHARS:,} from one reply"
        )
    if len(calls) + len(invalid) <= MAX_CALLS_KEPT:
        return reply
    logger.warning(
        "a model turn asked for %d tool calls: the first %d kept, %d run",
        len(calls) + len(invalid),
        MAX_CALLS_KEPT,
        MAX_CALLS_PER_TURN,
    )
    kept = calls[:MAX_CALLS_KEPT]
    return reply.model_copy(
        update={"tool_calls": kept, "invalid_tool_calls": invalid[: MAX_CALLS_KEPT - len(kept)]}
    )


def _names_cut(reply: AIMessage) -> AIMessage:
    """``reply`` with each tool call's name and id at most ``MAX_NAME_CHARS``: a name past it
    names no tool, and is answered as an unknown one of that length. Before, a model's
    3 MB name was kept whole in the call's span name, the run's steps and the status page
    (57 MB a render), the checkpoint (10 MB a conversation) and the log."""
    long = [
        c
        for c in (*reply.tool_calls, *reply.invalid_tool_calls)
        if len(c.get("name") or "") > MAX_NAME_CHARS or len(c.get("id") or "") > MAX_NAME_CHARS
    ]
    if not long:
        return reply
    logger.warning("a model turn named %d tool calls past %d characters: cut", len(long), MAX_NAME_CHARS)
    return reply.model_copy(
        update={
            "tool_calls": [_cut_call(c) for c in reply.tool_calls],
            "invalid_tool_calls": [_cut_call(c) for c in reply.invalid_tool_calls],
        }
    )


def _cut_call(call: Any) -> Any:
    name, call_id = call.get("name"), call.get("id")
    return {
        **call,
        "name": name[:MAX_NAME_CHARS] if name is not None else None,
        "id": call_id[:MAX_NAME_CHARS] if call_id is not None else None,
    }


def _found_text(query: str, hits: Sequence[Found]) -> str:
    if not hits:
        return f"No tool matches {shown(query)}. Try other words."
    lines = [f"Found {len(hits)} tools; they are offered to you from your next turn:"]
    lines += [f"- {h.tool.name}: {(h.tool.description or h.tool.title or '').strip()[:200]}" for h in hits]
    return "\n".join(lines)


def _key(index: int) -> str:
    return f"approve-{index}"


_TOO_MANY = f"Not run: at most {MAX_CALLS_PER_TURN} tool calls of one turn are run. Ask for fewer at once."
_SLOTS: WeakKeyDictionary[Principal, anyio.CapacityLimiter] = WeakKeyDictionary()


def _slots(client: Principal | None) -> anyio.CapacityLimiter | AbstractAsyncContextManager[None]:
    """Where a run's call waits for one of its client's slots for runs' calls."""
    if client is None or (limit := client.policy.max_concurrency) is None:
        return nullcontext()
    if (slots := _SLOTS.get(client)) is None:
        slots = _SLOTS[client] = anyio.CapacityLimiter(limit)
    elif slots.total_tokens != limit:  # a reload changed it: calls holding a slot keep it
        slots.total_tokens = limit  # a raise lets waiting calls in at once
    return slots


def _unparsable(call: InvalidToolCall) -> Outcome:
    name = call.get("name") or "(unnamed)"
    text = f"The call to {name} was not run: {call.get('error') or 'its arguments are not a JSON object'}."
    record = ToolCallRecord(
        name=name, arguments=recorded({"raw": call.get("args")}), is_error=True, duration_ms=0.0
    )
    message = ToolMessage(content=text, tool_call_id=call.get("id") or name, name=name, status="error")
    return message, record
