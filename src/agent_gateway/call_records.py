"""Each client call, once it has finished, as a ``Call`` for ``Activity``; and what HTTP
admission tells of the calls it refused before they were parsed."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from opentelemetry import trace

from agent_gateway.access import ANONYMOUS, Principal
from agent_gateway.activity import CALLED, Activity, Call, Outcome, cut, noting_refusals
from agent_gateway.compat.mcp import connection_of
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.sessions import STATE_KEY, DownstreamSession
from agent_gateway.errors import RATE_LIMITED, REFUSALS, AuditUnwritable, GatewayError
from agent_gateway.logs import Repeats, scrubbed
from agent_gateway.requested import Requested


class CallRecord:
    """One call being served, and how it ended so far (a result arrived: ``answered``). Entered
    around the call, it is handed to ``activity`` once the block ends, however it ends, as
    ``called`` (a ``Call`` but for how it ended); without them, nothing is recorded. A class,
    not a generator: it is entered once a request (a generator's frames cost 1 % of a call)."""

    __slots__ = (
        "_activity",
        "_at",
        "_called",
        "_noting",
        "_refusals",
        "_secrets",
        "_started",
        "detail",
        "outcome",
    )

    def __init__(
        self,
        activity: Activity | None = None,
        called: Callable[..., Call] | None = None,
        secrets: Callable[[], tuple[str, ...]] | None = None,
    ) -> None:
        """``secrets``: what the call's upstream is sent that its record must not repeat."""
        self.outcome: Outcome = "error"
        self.detail: str | None = None
        self._activity, self._called, self._secrets = activity, called, secrets

    def answered(self, result: HandlerResult) -> None:
        self.outcome, self.detail = _outcome_of(result)

    def __enter__(self) -> CallRecord:
        if self._called is not None:
            self._at, self._started = time.time(), time.perf_counter()
            self._noting = noting_refusals()
            self._refusals = self._noting.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self._activity is None or self._called is None:
            return
        self._noting.__exit__(kind, exc, tb)
        if exc is None:
            if self._refusals and self.outcome == "tool_error":
                self.outcome = "refused"
        elif isinstance(exc, MCPError):
            self.outcome = "refused" if exc.error.code == RATE_LIMITED else "error"
            self.detail = exc.error.message
        elif isinstance(exc, GatewayError):  # an agent run's call, not yet an answer to the wire
            self.outcome = "refused" if isinstance(exc, REFUSALS) else "error"
            self.detail = str(exc)
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            self.outcome = "cancelled"
        elif isinstance(exc, Exception):
            self.detail = type(exc).__name__
        detail = cut(self.detail)
        if detail is not None and self._secrets is not None:
            # A tool's error result is the upstream's text: one quoting the credential the
            # upstream is sent put it in the trail, the log and the status page. The upstream
            # session takes it out first (``translation.unquoted``); this is for any detail
            # that reaches a record by another path.
            detail = scrubbed(detail, self._secrets())
        self._activity.finished(
            self._called(
                at=self._at,
                outcome=self.outcome,
                detail=detail,
                duration_ms=round((time.perf_counter() - self._started) * 1e3, 1),
                trace_id=_trace_id(),
            )
        )


@dataclass(frozen=True)
class RunCall:
    """One tool call an ``ask_agent`` run makes: for ``client``, asked through ``caller``."""

    run: str
    client: Principal | None
    caller: Caller | None
    name: str
    upstream: str | None
    arguments: dict[str, Any]
    method: str = "tools/call"
    """What the client's own request would be: ``resources/read`` for the model's ``read_resource``."""


class CallRecorder:
    """Hands every finished call to ``activity`` (entered by ``request_wrapper.RequestWrapper``,
    inside the request's SERVER span so the record carries its trace id, and around the
    access checks so a call they refuse is recorded too)."""

    def __init__(
        self,
        activity: Activity,
        arguments: Literal["none", "digest", "full"] = "digest",
        unaudited: Callable[[], str | None] | None = None,
        secrets: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        """``arguments``: what a record keeps of the call's arguments; ``unaudited``: why a
        call would go unaudited now, or None (``audit.required``: such a call is refused);
        ``secrets``: what an upstream (by name) is sent that a record must not repeat."""
        self._activity = activity
        self._arguments = arguments
        self._unaudited = unaudited
        self._secrets = secrets

    def _secrets_of(self, upstream: str | None) -> Callable[[], tuple[str, ...]] | None:
        return partial(self._secrets, upstream) if self._secrets is not None and upstream else None

    def check_audited(self, method: str) -> None:
        """Refuse a call ``method`` while the audit trail cannot take its record, when
        ``audit.required`` says it must (raises ``AuditUnwritable``)."""
        if self._unaudited is not None and method in CALLED and (why := self._unaudited()):
            raise AuditUnwritable(f"not served: the audit trail {why} (audit.required)")

    def recording(self, ctx: ServerRequestContext[Any, Any], request: Requested, client: str) -> CallRecord:
        """To enter around one request from ``client`` (its subject), for what ``request`` says
        it is for: a call is recorded when it ends, however it ends; any other request is not."""
        if ctx.method not in CALLED:
            return CallRecord()
        called = partial(
            Call,
            client=client,
            software=_software(ctx.session),
            session=_session_id(ctx.session),
            method=ctx.method,
            name=cut(request.target or "", 200) or "",
            upstream=request.upstream,
            **self._arguments_kept(request.arguments),
        )
        return CallRecord(self._activity, called, self._secrets_of(request.upstream))

    def run_call(self, call: RunCall) -> CallRecord:
        """To enter around one tool call an ``ask_agent`` run makes for its client: recorded as
        that client's ``tools/call`` (a read as its ``resources/read``), with the run's id (the
        trail says who called what, and the agent's calls are the client's, on the client's
        policy); ``check_audited`` within it, as the client's own call is checked."""
        server_session = call.caller.server_session if call.caller is not None else None
        called = partial(
            Call,
            client=call.client.subject if call.client is not None else ANONYMOUS,
            software=_software(server_session) if server_session is not None else None,
            session=_session_id(server_session) if server_session is not None else None,
            method=call.method,
            name=call.name,
            upstream=call.upstream,
            run=call.run,
            **self._arguments_kept(call.arguments),
        )
        return CallRecord(self._activity, called, self._secrets_of(call.upstream))

    def _arguments_kept(self, arguments: Any) -> dict[str, Any]:
        """What a record keeps of ``arguments``: their digest, and with ``full`` themselves, or
        past ``ARGUMENTS_KEPT`` bytes what they were (16 calls of 3.5 MB held 1.3 GB in the
        audit writer's queue)."""
        if self._arguments == "none" or (canonical := _canonical(arguments)) is None:
            return {}
        kept: dict[str, Any] = {"arguments_digest": hashlib.sha256(canonical.encode()).hexdigest()}
        if self._arguments == "full":
            size = len(canonical)
            kept["arguments"] = arguments if size <= ARGUMENTS_KEPT else {"cut": f"{size:,} characters"}
            kept["arguments_bytes"] = min(size, ARGUMENTS_KEPT)
        return kept


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


def _session_id(server_session: ServerSession) -> str | None:
    session = connection_of(server_session).state.get(STATE_KEY)
    return session.id if isinstance(session, DownstreamSession) else None


def _software(server_session: ServerSession) -> str | None:
    params = server_session.client_params
    return cut(params.client_info.name, 64) if params is not None else None


_PEEKED = 4096
_SESSION_CHARS = 64
_REFUSALS_EVERY = 1.0
"""Seconds between two refusals of one kind of one client's recorded (admission's)."""
_KIND = 40
"""Characters of a refusal's reason that make its kind (a rate limit's, a header check's)."""
_KINDS_KEPT = 10_000
ARGUMENTS_KEPT = 64 << 10
"""Characters of arguments a record keeps with ``audit.arguments: full``."""
_METHOD = re.compile(rb'"method"\s*:\s*"([a-z/]{1,32})"')
_NAME = re.compile(rb'"(?:name|uri)"\s*:\s*"([^"\\]{1,200})"')


def admission_refusals(activity: Activity) -> Callable[[str, str | None, bytes, str], None]:
    """What HTTP admission tells of a request it refused unparsed (rate limit, session cap):
    recorded as a refused call when it was one (its method and name read from the body's
    first bytes, never parsed)."""

    # A client's refusals set the audit trail's pace: one sending as fast as it could, refused,
    # rotated every earlier record out of the trail in 20 s. One a second of each kind.
    repeats = Repeats(_REFUSALS_EVERY, _KINDS_KEPT)

    def record(client: str, session: str | None, body: bytes, why: str) -> None:
        head = body[:_PEEKED]
        method = _METHOD.search(head)
        if method is None or (name := method.group(1).decode()) not in CALLED:
            return
        if (unrecorded := repeats.first((client, why[:_KIND]))) is None:
            return
        named = _NAME.search(head)
        more = f" (and {unrecorded} more like it from this client since, not recorded)" if unrecorded else ""
        activity.finished(
            Call(
                at=time.time(),
                client=client,
                software=None,
                session=cut(session, _SESSION_CHARS),  # the client's header, not an id given
                method=name,
                name=named.group(1).decode(errors="replace") if named else "",
                upstream=None,
                outcome="refused",
                detail=f"{cut(why)}{more}",
                duration_ms=0.0,
                trace_id=None,
            )
        )

    return record


def _canonical(arguments: Any) -> str | None:
    if arguments is None:
        return None
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


def _trace_id() -> str | None:
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
