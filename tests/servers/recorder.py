"""An upstream that records what reaches it: request ids, ``_meta``, cancellations, logs.

Built inline by HTTP tests (``build(events)``) or run as a stdio script, which appends
every event as one JSON line to the file named by ``RECORDER_LOG``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
import uvicorn
from fastmcp import Context, FastMCP
from fastmcp.server.dependencies import get_context
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Sink = Callable[[dict[str, Any]], None]


class _Notifications(Middleware):
    """Records every notification the upstream receives (cancellations above all)."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    async def on_notification(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        params = context.message  # the raw wire params (a dict) for notifications
        dumped = dict(params) if isinstance(params, Mapping) else {}
        # Which upstream session received it: a per-client stdio session is a process of its own.
        ctx = context.fastmcp_context
        session = ctx.session_id if ctx is not None else None
        self._sink(
            {
                "event": "notification",
                "method": context.method,
                "params": dumped,
                "pid": os.getpid(),
                "session": session,
            }
        )
        return await call_next(context)

    async def on_request(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        params = context.message
        if context.method == "logging/setLevel":
            level = params.get("level") if isinstance(params, Mapping) else getattr(params, "level", None)
            self._sink({"event": "set_level", "level": level})
        if context.method == "subscriptions/listen" and isinstance(params, Mapping):
            wanted: Any = params.get("notifications", {})  # pyright: ignore[reportUnknownMemberType]
            uris = wanted.get("resourceSubscriptions") or []
            self._sink({"event": "listen", "uris": uris})
            try:
                return await call_next(context)
            finally:
                self._sink({"event": "listen_ended", "uris": uris})
        return await call_next(context)


def _request(ctx: Context) -> dict[str, Any]:
    request = ctx.request_context
    meta = dict(request.meta or {}) if request is not None else {}
    return {"request_id": ctx.request_id, "meta": meta}


def _modern(ctx: Context) -> bool:
    request = ctx.request_context
    return request is not None and request.protocol_version in MODERN_PROTOCOL_VERSIONS


def build(sink: Sink) -> FastMCP:
    server = FastMCP("recorder", instructions="Records what it receives.", middleware=[_Notifications(sink)])
    value = {"n": 0}
    events = InMemorySubscriptionBus()

    @server.tool
    async def wait(seconds: float, ctx: Context) -> str:
        """Sleep for ``seconds``, reporting progress; records start and cancellation."""
        seen = _request(ctx)
        sink({"event": "started", **seen})
        try:
            await ctx.report_progress(0, 1, "started")
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            sink({"event": "handler_cancelled", **seen})
            raise
        return "done"

    @server.tool
    async def whoami(ctx: Context) -> dict[str, Any]:
        """The request id and ``_meta`` this call arrived with, and who answered it."""
        return {**_request(ctx), "pid": os.getpid(), "session": ctx.session_id}

    tallies: dict[str, int] = {}

    @server.tool
    async def tally(by: int, ctx: Context) -> int:
        """Add ``by`` to this upstream session's own tally (state a session must not share)."""
        key = ctx.session_id
        tallies[key] = tallies.get(key, 0) + by
        await anyio.lowlevel.checkpoint()  # let other sessions' calls interleave
        return tallies[key]

    @server.tool
    async def steps(count: int, ctx: Context, pad: str = "") -> int:
        """Report ``count`` progress steps, in order (``pad`` after each message), then return ``count``."""
        for step in range(1, count + 1):
            await ctx.report_progress(step, count, f"step {step}{pad}")
        return count

    @server.tool
    async def say(text: str, ctx: Context, level: str = "info") -> str:
        """Send ``text`` as a log message at ``level`` during the call."""
        with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
            await ctx.log(text, level=level)  # type: ignore[arg-type]
        return text

    @server.tool
    async def sample(prompt: str, ctx: Context) -> str | types.InputRequiredResult:
        """Ask the client's model (sampling/createMessage, or an input request when modern)."""
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
        if not _modern(ctx):
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                reply = await ctx.session.create_message(
                    messages=[message], max_tokens=50, related_request_id=ctx.request_id
                )
            return reply.content.text if isinstance(reply.content, types.TextContent) else str(reply.content)
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(messages=[message], max_tokens=50)
        )
        answer = ctx.input_responses
        if answer is None:
            return types.InputRequiredResult(input_requests={"llm": request})
        content = answer["llm"].content  # type: ignore[union-attr]
        return content.text if isinstance(content, types.TextContent) else str(content)

    @server.tool
    async def ask(question: str, ctx: Context) -> str | types.InputRequiredResult:
        """Ask the user (elicitation/create, or an input request when modern) for a string."""
        if not _modern(ctx):
            seen = _request(ctx)
            sink({"event": "asking", **seen})
            try:
                result = await ctx.elicit(question, response_type=str)
            except anyio.get_cancelled_exc_class():
                sink({"event": "handler_cancelled", **seen})
                raise
            except Exception as exc:  # the client's answer was an error
                sink({"event": "unanswered", "error": str(exc), **seen})
                raise
            sink({"event": "answered", "action": result.action, **seen})
            return f"{result.action}:{getattr(result, 'data', '')}"
        schema = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message=question, requested_schema=schema)
        )
        if ctx.input_responses is None:
            return types.InputRequiredResult(input_requests={"ask": request})
        answer = ctx.input_responses["ask"]
        assert isinstance(answer, types.ElicitResult)
        return f"{answer.action}:{(answer.content or {}).get('value', '')}"

    @server.tool
    async def roots(ctx: Context) -> list[str] | types.InputRequiredResult:
        """The client's roots (roots/list, or an input request when modern)."""
        if not _modern(ctx):
            with warnings.catch_warnings(action="ignore"):  # deprecated in 2026-07-28, not in this era
                listed = await ctx.session.list_roots()  # on the session's own channel, not the call's
            return [str(root.uri) for root in listed.roots]
        if ctx.input_responses is None:
            return types.InputRequiredResult(input_requests={"roots": types.ListRootsRequest()})
        answer = ctx.input_responses["roots"]
        assert isinstance(answer, types.ListRootsResult)
        return [str(root.uri) for root in answer.roots]

    @server.resource("counter://value", mime_type="text/plain")
    def counter() -> str:
        return str(value["n"])

    @server.tool
    async def bump(ctx: Context) -> int:
        """Increment counter://value and announce the update to subscribers."""
        value["n"] += 1
        if _modern(ctx):  # 2026-07-28: on the listen streams that named the resource
            await events.publish(ResourceUpdated(uri="counter://value"))
            return value["n"]
        await ctx.send_notification(
            types.ResourceUpdatedNotification(
                params=types.ResourceUpdatedNotificationParams(uri="counter://value")
            )
        )
        return value["n"]

    @server.resource("note://{name}", mime_type="text/plain")
    def note(name: str) -> str:
        return name

    @server.resource("slow://{steps}", mime_type="text/plain")
    async def slow(steps: str, ctx: Context) -> str:
        """Report ``steps`` progress steps while read; record the request's ``_meta``."""
        sink({"event": "read", **_request(ctx)})
        for step in range(1, int(steps) + 1):
            await ctx.report_progress(step, int(steps), f"read {step}")
        return f"read in {steps}"

    @server.prompt
    async def drafted(steps: str, ctx: Context) -> str:
        """Report ``steps`` progress steps while rendered."""
        for step in range(1, int(steps) + 1):
            await ctx.report_progress(step, int(steps), f"draft {step}")
        return f"drafted in {steps}"

    async def _waiting(what: str, seconds: float, ctx: Context) -> None:
        """Sleep for ``seconds`` while serving ``what``; record its start and cancellation."""
        seen = {"what": what, **_request(ctx)}
        sink({"event": "started", **seen})
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            sink({"event": "handler_cancelled", **seen})
            raise

    @server.prompt
    async def waiting(seconds: str, ctx: Context) -> str:
        """Rendered after ``seconds``; records its start and cancellation."""
        await _waiting("prompt", float(seconds), ctx)
        return f"waited {seconds}"

    @server.resource("wait://{seconds}", mime_type="text/plain")
    async def waited(seconds: str, ctx: Context) -> str:
        """Read after ``seconds``; records its start and cancellation."""
        await _waiting("resource", float(seconds), ctx)
        return f"waited {seconds}"

    @server.completion
    async def complete(ref: Any, argument: types.CompletionArgument, context: Any) -> list[str]:
        """Completes ``steps`` reporting that many progress steps; any other argument after
        ``argument.value`` seconds, recording its start and cancellation."""
        if argument.name == "steps":
            steps = int(argument.value)
            for step in range(1, steps + 1):
                await get_context().report_progress(step, steps, f"complete {step}")
            return [argument.value]
        await _waiting("completion", float(argument.value or 0), get_context())
        return [argument.value]

    @server.tool
    async def updates(uri: str, times: int, ctx: Context) -> int:
        """Announce ``times`` updates of ``uri`` to its subscribers."""
        if _modern(ctx):  # on the listen streams that named it
            for _ in range(times):
                await events.publish(ResourceUpdated(uri=uri))
            return times
        for _ in range(times):
            params = types.ResourceUpdatedNotificationParams(uri=uri)
            await ctx.send_notification(types.ResourceUpdatedNotification(params=params))
        return times

    # FastMCP serves no resources/subscribe; a real stateful server would.
    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        sink({"event": "subscribe", "uri": params.uri})
        if params.uri.startswith("wait://"):  # answered after that many seconds
            seen = {"what": "subscribe", "request_id": str(ctx.request_id), "meta": {}}
            sink({"event": "started", **seen})
            try:
                await anyio.sleep(float(params.uri.removeprefix("wait://")))
            except anyio.get_cancelled_exc_class():
                sink({"event": "handler_cancelled", **seen})
                raise
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        sink({"event": "unsubscribe", "uri": params.uri})
        return types.EmptyResult()

    listening = ListenHandler(events)  # the gateway's own stream of list changes
    watching = ListenHandler(events)  # streams naming resources: end_listens ends these alone

    async def listen(
        ctx: Any, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        handler = watching if params.notifications.resource_subscriptions else listening
        return await handler(ctx, params)

    @server.tool
    async def end_listens() -> str:
        """End every listen stream naming resources gracefully (modern era)."""
        watching.close()
        return "ended"

    lowlevel = server._mcp_server  # pyright: ignore[reportPrivateUsage]
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    lowlevel.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, listen)
    return server


def _file_sink(path: str) -> Sink:
    def write(event: dict[str, Any]) -> None:
        # perf_counter is CLOCK_MONOTONIC here: comparable with other processes' on this machine.
        stamped = {**event, "at": time.perf_counter()}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(stamped, default=str) + "\n")

    return write


if __name__ == "__main__":
    # stdio by default; `--http PORT` serves Streamable HTTP on loopback at /mcp instead.
    log = os.environ.get("RECORDER_LOG")
    server = build(_file_sink(log) if log else (lambda _: None))
    if sys.argv[1:2] == ["--http"]:
        uvicorn.run(
            server.http_app(path="/mcp"), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )
    else:
        server.run(show_banner=False, log_level="WARNING")
