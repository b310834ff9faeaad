"""An upstream that records what reaches it: request ids, ``_meta``, cancellations, logs.

Built inline by HTTP tests (``build(events)``) or run as a stdio script, which appends
every event as one JSON line to the file named by ``RECORDER_LOG``.

On the SDK's low-level server (``lowlevel_tools.py``), saying what the FastMCP server it was
said, to the byte: the suite starts it as a stdio upstream hundreds of times a run.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette

if __package__:  # imported as tests.servers.recorder
    from . import lowlevel_tools as tools_
    from . import recorder_listings as listed
else:  # run as a script, or imported by a sibling script: its directory first on sys.path
    import lowlevel_tools as tools_
    import recorder_listings as listed

Context, Tools, elicit_text, log = tools_.Context, tools_.Tools, tools_.elicit_text, tools_.log
report_progress, serve_stdio, session_id = tools_.report_progress, tools_.serve_stdio, tools_.session_id

Sink = Callable[[dict[str, Any]], None]
Arguments = dict[str, Any]

_NUMBER, _INTEGER, _STRING = {"type": "number"}, {"type": "integer"}, {"type": "string"}


class _Recording:
    """Records every notification the upstream receives (cancellations above all), each
    ``logging/setLevel`` and each ``subscriptions/listen`` stream's start and end."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    async def __call__(self, ctx: Context, call_next: CallNext) -> HandlerResult:
        params = dict(ctx.params or {})  # the raw wire params
        if ctx.request_id is None:  # which session received it: a per-client stdio one is a process
            note = {"method": ctx.method, "params": params, "pid": os.getpid(), "session": session_id(ctx)}
            self._sink({"event": "notification", **note})
        elif ctx.method == "logging/setLevel":
            self._sink({"event": "set_level", "level": params.get("level")})
        elif ctx.method == "subscriptions/listen":
            uris = (params.get("notifications") or {}).get("resourceSubscriptions") or []
            self._sink({"event": "listen", "uris": uris})
            try:
                return await call_next(ctx)
            finally:
                self._sink({"event": "listen_ended", "uris": uris})
        return await call_next(ctx)


def _request(ctx: Context) -> dict[str, Any]:
    """The request's id as FastMCP gave it (a string) and its ``_meta`` as it came on the wire."""
    meta = (ctx.params or {}).get("_meta")
    return {"request_id": str(ctx.request_id), "meta": dict(meta) if isinstance(meta, dict) else {}}


def _modern(ctx: Context) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _answers(ctx: Context) -> types.InputResponses | None:
    """The client's answers to an earlier InputRequiredResult (FastMCP's ``input_responses``)."""
    return types.InputResponseRequestParams.model_validate(dict(ctx.params or {})).input_responses


async def _announce(ctx: Context, uri: str) -> None:
    """An update of ``uri``, on the call's own stream (handshake era)."""
    params = types.ResourceUpdatedNotificationParams(uri=uri)
    notification = types.ResourceUpdatedNotification(params=params)
    await ctx.session.send_notification(notification, related_request_id=str(ctx.request_id))


async def _waiting(sink: Sink, seen: dict[str, Any], seconds: float) -> None:
    """Sleep for ``seconds``; record the start and any cancellation of ``seen``."""
    sink({"event": "started", **seen})
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        sink({"event": "handler_cancelled", **seen})
        raise


class Recorder:
    """The recorder's low-level server, with FastMCP's ``http_app`` and ``add_middleware``
    (SDK middleware: ``(ctx, call_next)``) for the tests that serve or wrap it inline."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.tools = Tools(marks=True)
        self.value = 0
        self.tallies: dict[str, int] = {}
        self.events = InMemorySubscriptionBus()
        self.listening = ListenHandler(self.events)  # the gateway's own stream of list changes
        self.watching = ListenHandler(self.events)  # streams naming resources: end_listens ends these
        _tools(self)
        self.server = self.tools.server(
            "recorder",
            instructions="Records what it receives.",
            version=version("fastmcp"),  # FastMCP named its own version in serverInfo
            on_list_resources=listed.list_resources,
            on_list_resource_templates=listed.list_templates,
            on_read_resource=self._read,
            on_list_prompts=listed.list_prompts,
            on_get_prompt=self._prompt,
            on_completion=self._complete,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )
        self.server.extensions = {"io.modelcontextprotocol/ui": {}}  # as FastMCP declares
        self.server.middleware.append(_Recording(sink))

    def tool(
        self, name: str, description: str, properties: dict[str, dict[str, Any]]
    ) -> Callable[[Any], Any]:
        """Register a string-valued tool more (as tests add theirs with FastMCP's ``@server.tool``)."""
        return self.tools.tool(name, description, "string", properties)

    def add_middleware(self, middleware: ServerMiddleware[Any]) -> None:
        """Inside the recording one (as FastMCP's ``add_middleware`` ran after it)."""
        self.server.middleware.append(middleware)

    def http_app(self, path: str = "/mcp") -> Starlette:
        """Streamable HTTP at ``path``, any Host accepted (as FastMCP's app)."""
        anyone = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        return self.server.streamable_http_app(streamable_http_path=path, transport_security=anyone)

    async def _read(self, ctx: Context, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == "counter://value":
            text = str(self.value)
        elif match := re.fullmatch(r"note://([^/]+)", uri):
            text = match[1]
        elif match := re.fullmatch(r"slow://([^/]+)", uri):  # progress while read; the _meta recorded
            self.sink({"event": "read", **_request(ctx)})
            steps = int(match[1])
            for step in range(1, steps + 1):
                await report_progress(ctx, step, steps, f"read {step}")
            text = f"read in {match[1]}"
        elif match := re.fullmatch(r"wait://([^/]+)", uri):
            await _waiting(self.sink, {"what": "resource", **_request(ctx)}, float(match[1]))
            text = f"waited {match[1]}"
        else:
            raise MCPError(types.INVALID_PARAMS, f"Resource not found: {uri!r}", {"uri": uri})
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type=listed.TEXT, text=text)]
        )

    async def _prompt(self, ctx: Context, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        arguments = params.arguments or {}
        if params.name == "drafted":  # progress while rendered
            steps = int(arguments["steps"])
            for step in range(1, steps + 1):
                await report_progress(ctx, step, steps, f"draft {step}")
            text = f"drafted in {arguments['steps']}"
        elif params.name == "waiting":
            await _waiting(self.sink, {"what": "prompt", **_request(ctx)}, float(arguments["seconds"]))
            text = f"waited {arguments['seconds']}"
        else:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name!r}")
        message = types.PromptMessage(role="user", content=types.TextContent(text=text))
        return types.GetPromptResult(description=listed.PROMPTS[params.name], messages=[message])

    async def _complete(self, ctx: Context, params: types.CompleteRequestParams) -> types.CompleteResult:
        """Completes ``steps`` reporting that many progress steps; any other argument after
        ``argument.value`` seconds, recording its start and cancellation."""
        argument = params.argument
        if argument.name == "steps":
            steps = int(argument.value)
            for step in range(1, steps + 1):
                await report_progress(ctx, step, steps, f"complete {step}")
        else:
            seen = {"what": "completion", **_request(ctx)}
            await _waiting(self.sink, seen, float(argument.value or 0))
        return types.CompleteResult(completion=types.Completion(values=[argument.value]))

    # FastMCP served no resources/subscribe; the recorder added it, as a stateful server would.
    async def _subscribe(self, ctx: Context, params: types.SubscribeRequestParams) -> types.EmptyResult:
        self.sink({"event": "subscribe", "uri": params.uri})
        if params.uri.startswith("wait://"):  # answered after that many seconds
            seen = {"what": "subscribe", "request_id": str(ctx.request_id), "meta": {}}
            await _waiting(self.sink, seen, float(params.uri.removeprefix("wait://")))
        return types.EmptyResult()

    async def _unsubscribe(self, _: Context, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        self.sink({"event": "unsubscribe", "uri": params.uri})
        return types.EmptyResult()

    async def _listen(
        self, ctx: Context, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        handler = self.watching if params.notifications.resource_subscriptions else self.listening
        return await handler(ctx, params)


def _tools(rec: Recorder) -> None:
    """The recorder's tools, in FastMCP's order (their docstrings its descriptions)."""
    tool, sink = rec.tools.tool, rec.sink

    @tool("wait", "Sleep for ``seconds``, reporting progress; records start and cancellation.", "string",
          {"seconds": _NUMBER})  # fmt: skip
    async def _wait(ctx: Context, arguments: Arguments) -> str:
        seconds, seen = float(arguments["seconds"]), _request(ctx)  # a wrong argument: not started
        sink({"event": "started", **seen})
        try:
            await report_progress(ctx, 0, 1, "started")
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            sink({"event": "handler_cancelled", **seen})
            raise
        return "done"

    @tool("whoami", "The request id and ``_meta`` this call arrived with, and who answered it.",
          {"additionalProperties": True, "type": "object"}, wrap=False)  # fmt: skip
    def _whoami(ctx: Context, _: Arguments) -> dict[str, Any]:
        return {**_request(ctx), "pid": os.getpid(), "session": session_id(ctx)}

    @tool("tally", "Add ``by`` to this upstream session's own tally (state a session must not share).",
          "integer", {"by": _INTEGER})  # fmt: skip
    async def _tally(ctx: Context, arguments: Arguments) -> int:
        key = session_id(ctx)
        rec.tallies[key] = rec.tallies.get(key, 0) + int(arguments["by"])
        await anyio.lowlevel.checkpoint()  # let other sessions' calls interleave
        return rec.tallies[key]

    @tool("steps", "Report ``count`` progress steps, in order (``pad`` after each message), then return ``count``.",
          "integer", {"count": _INTEGER, "pad": {"default": "", "type": "string"}})  # fmt: skip
    async def _steps(ctx: Context, arguments: Arguments) -> int:
        count, pad = int(arguments["count"]), str(arguments.get("pad", ""))
        for step in range(1, count + 1):
            await report_progress(ctx, step, count, f"step {step}{pad}")
        return count

    @tool("say", "Send ``text`` as a log message at ``level`` during the call.", "string",
          {"text": _STRING, "level": {"default": "info", "type": "string"}})  # fmt: skip
    async def _say(ctx: Context, arguments: Arguments) -> str:
        await log(ctx, str(arguments["text"]), str(arguments.get("level", "info")))
        return str(arguments["text"])

    tool("sample", "Ask the client's model (sampling/createMessage, or an input request when modern).",
         "string", {"prompt": _STRING})(_sample)  # fmt: skip
    tool("ask", "Ask the user (elicitation/create, or an input request when modern) for a string.",
         "string", {"question": _STRING})(lambda ctx, arguments: _ask(sink, ctx, arguments))  # fmt: skip
    tool("roots", "The client's roots (roots/list, or an input request when modern).",
         {"items": _STRING, "type": "array"})(_roots)  # fmt: skip

    @tool("bump", "Increment counter://value and announce the update to subscribers.", "integer")
    async def _bump(ctx: Context, _: Arguments) -> int:
        rec.value += 1
        if _modern(ctx):  # 2026-07-28: on the listen streams that named the resource
            await rec.events.publish(ResourceUpdated(uri="counter://value"))
        else:
            await _announce(ctx, "counter://value")
        return rec.value

    @tool("updates", "Announce ``times`` updates of ``uri`` to its subscribers.", "integer",
          {"uri": _STRING, "times": _INTEGER})  # fmt: skip
    async def _updates(ctx: Context, arguments: Arguments) -> int:
        uri, times = str(arguments["uri"]), int(arguments["times"])
        for _ in range(times):
            if _modern(ctx):  # on the listen streams that named it
                await rec.events.publish(ResourceUpdated(uri=uri))
            else:
                await _announce(ctx, uri)
        return times

    @tool("end_listens", "End every listen stream naming resources gracefully (modern era).", "string")
    def _end_listens(_: Context, __: Arguments) -> str:
        rec.watching.close()
        return "ended"


async def _sample(ctx: Context, arguments: Arguments) -> str | types.InputRequiredResult:
    content = types.TextContent(text=str(arguments["prompt"]))
    message = types.SamplingMessage(role="user", content=content)
    if not _modern(ctx):
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            reply = await ctx.session.create_message(
                messages=[message], max_tokens=50, related_request_id=str(ctx.request_id)
            )
        return reply.content.text if isinstance(reply.content, types.TextContent) else str(reply.content)
    answers = _answers(ctx)
    if answers is None:
        params = types.CreateMessageRequestParams(messages=[message], max_tokens=50)
        return types.InputRequiredResult(input_requests={"llm": types.CreateMessageRequest(params=params)})
    answer = answers["llm"].content  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
    return answer.text if isinstance(answer, types.TextContent) else str(answer)  # pyright: ignore[reportUnknownArgumentType]


async def _ask(sink: Sink, ctx: Context, arguments: Arguments) -> str | types.InputRequiredResult:
    question = str(arguments["question"])
    if not _modern(ctx):
        seen = _request(ctx)
        sink({"event": "asking", **seen})
        try:
            result = await elicit_text(ctx, question)
        except anyio.get_cancelled_exc_class():
            sink({"event": "handler_cancelled", **seen})
            raise
        except Exception as exc:  # the client's answer was an error
            sink({"event": "unanswered", "error": str(exc), **seen})
            raise
        sink({"event": "answered", "action": result.action, **seen})
        return answered(result)
    answers = _answers(ctx)
    if answers is None:
        schema = {"type": "object", "properties": {"value": _STRING}, "required": ["value"]}
        params = types.ElicitRequestFormParams(message=question, requested_schema=schema)
        return types.InputRequiredResult(input_requests={"ask": types.ElicitRequest(params=params)})
    answer = answers["ask"]
    assert isinstance(answer, types.ElicitResult)
    return f"{answer.action}:{(answer.content or {}).get('value', '')}"


def answered(result: types.ElicitResult) -> str:
    """``action:value`` (nothing after the colon unless accepted), as FastMCP's result read."""
    value = (result.content or {}).get("value", "") if result.action == "accept" else ""
    return f"{result.action}:{value}"


async def _roots(ctx: Context, _: Arguments) -> list[str] | types.InputRequiredResult:
    if not _modern(ctx):
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            listed = await ctx.session.list_roots()  # on the session's own channel, not the call's
        return [str(root.uri) for root in listed.roots]
    answers = _answers(ctx)
    if answers is None:
        return types.InputRequiredResult(input_requests={"roots": types.ListRootsRequest()})
    answer = answers["roots"]
    assert isinstance(answer, types.ListRootsResult)
    return [str(root.uri) for root in answer.roots]


def build(sink: Sink) -> Recorder:
    return Recorder(sink)


def _file_sink(path: str) -> Sink:
    def write(event: dict[str, Any]) -> None:
        # perf_counter is CLOCK_MONOTONIC here: comparable with other processes' on this machine.
        stamped = {**event, "at": time.perf_counter()}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(stamped, default=str) + "\n")

    return write


def main(recorder: Recorder) -> None:
    """Serve stdio by default; ``--http PORT`` serves Streamable HTTP on loopback at /mcp."""
    if sys.argv[1:2] == ["--http"]:
        uvicorn.run(
            recorder.http_app(path="/mcp"), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )
    else:
        anyio.run(serve_stdio, recorder.server)


if __name__ == "__main__":
    log_path = os.environ.get("RECORDER_LOG")
    main(build(_file_sink(log_path) if log_path else (lambda _: None)))
