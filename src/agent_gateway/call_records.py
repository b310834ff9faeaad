"""Each client call, once it has finished, as a ``Call`` for ``Activity``.

A low-level middleware, inside the request's SERVER span (so the call carries its trace id)
and outside the access check (so a call refused by the client's rate limit is recorded too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from opentelemetry import trace

from agent_gateway.access import RATE_LIMITED, AccessControl, token_of
from agent_gateway.activity import CALLED, Activity, Call, Outcome, cut
from agent_gateway.sessions import STATE_KEY, DownstreamSession


class CallRecorder:
    """Low-level middleware: hands every finished call to ``activity``."""

    def __init__(
        self, activity: Activity, access: AccessControl, upstream_of: Callable[[str, str], str | None]
    ) -> None:
        """``upstream_of(method, name)``: the upstream a call of ``name`` goes to, or None."""
        self._activity = activity
        self._access = access
        self._upstream_of = upstream_of

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method not in CALLED or ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params or {}
        name = params.get("uri" if ctx.method == "resources/read" else "name")
        name = cut(name if isinstance(name, str) else "", 200) or ""
        at, started = time.time(), time.perf_counter()
        outcome: Outcome = "error"
        detail: str | None = None
        try:
            result = await call_next(ctx)
            outcome, detail = _outcome_of(result)
            return result
        except MCPError as exc:
            outcome = "refused" if exc.error.code == RATE_LIMITED else "error"
            detail = exc.error.message
            raise
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        except Exception as exc:
            detail = type(exc).__name__
            raise
        finally:
            self._activity.finished(
                Call(
                    at=at,
                    client=self._access.principal(token_of(ctx.request)).subject,
                    software=_software(ctx),
                    session=_session_id(ctx),
                    method=ctx.method,
                    name=name,
                    upstream=self._upstream_of(ctx.method, name),
                    outcome=outcome,
                    detail=cut(detail),
                    duration_ms=round((time.perf_counter() - started) * 1e3, 1),
                    trace_id=_trace_id(),
                )
            )


def _outcome_of(result: HandlerResult) -> tuple[Outcome, str | None]:
    if isinstance(result, types.InputRequiredResult):
        return "paused", None
    if isinstance(result, types.CallToolResult):
        return ("tool_error", _text(result.content)) if result.is_error else ("ok", None)
    if isinstance(result, Mapping) and result.get("isError") is True:  # pyright: ignore[reportUnknownMemberType]
        content = result.get("content")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        return "tool_error", _raw_text(content)
    if isinstance(result, Mapping) and "inputRequests" in result:
        return "paused", None
    return "ok", None


def _text(content: list[types.ContentBlock]) -> str | None:
    return next((block.text for block in content if isinstance(block, types.TextContent)), None)


def _raw_text(content: object) -> str | None:
    if not isinstance(content, list):
        return None
    for block in content:  # pyright: ignore[reportUnknownVariableType]
        if isinstance(block, Mapping) and isinstance(text := block.get("text"), str):  # pyright: ignore[reportUnknownMemberType]
            return text
    return None


def _session_id(ctx: ServerRequestContext[Any, Any]) -> str | None:
    session = ctx.session._connection.state.get(STATE_KEY)  # pyright: ignore[reportPrivateUsage]
    return session.id if isinstance(session, DownstreamSession) else None


def _software(ctx: ServerRequestContext[Any, Any]) -> str | None:
    params = ctx.session.client_params
    return cut(params.client_info.name, 64) if params is not None else None


def _trace_id() -> str | None:
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
