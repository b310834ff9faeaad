"""What a client can be asked during a call (sampling, elicitation, roots): whether it
declared it can answer, and the model its answer is read as."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.server.validation import check_sampling_tools_capability, wants_sampling_tools
from mcp.shared.exceptions import MCPError


def refusal(
    modern: bool, capabilities: types.ClientCapabilities | None, request: types.InputRequest
) -> types.ErrorData | None:
    """Why ``request`` cannot be relayed to a client (of the modern era, or with
    ``capabilities``), as an error for the upstream."""
    if modern:
        return types.ErrorData(
            code=types.INVALID_REQUEST,
            message=f"agent-gateway: the client speaks MCP 2026-07-28, which cannot answer {request.method} "
            "from a handshake-era upstream",
        )
    return unsupported(capabilities, request)


def unsupported(
    capabilities: types.ClientCapabilities | None, request: types.InputRequest
) -> types.ErrorData | None:
    """Why a client with ``capabilities`` cannot answer ``request``, or None if it can."""
    caps = capabilities or types.ClientCapabilities()
    capability = {
        "sampling/createMessage": caps.sampling,
        "elicitation/create": caps.elicitation,
        "roots/list": caps.roots,
    }[request.method]
    if capability is None:
        return _undeclared(request.method)
    # The gateway tells upstreams it can do everything, so the parts are checked here, as the
    # upstream's own SDK would check a client it spoke to directly.
    if isinstance(request, types.CreateMessageRequest):
        params = request.params
        if wants_sampling_tools(params.tools, params.tool_choice) and not check_sampling_tools_capability(
            caps
        ):
            return _undeclared("sampling/createMessage with tools")
    if isinstance(request, types.ElicitRequest) and isinstance(caps.elicitation, types.ElicitationCapability):
        url = isinstance(request.params, types.ElicitRequestURLParams)
        if url and caps.elicitation.url is None:
            return _undeclared("elicitation/create in url mode")
        if not url and caps.elicitation.url is not None and caps.elicitation.form is None:
            return _undeclared("elicitation/create in form mode")
    return None


def elicits_by_url(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether a client declared URL-mode elicitation (and so understands its completion)."""
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


def _undeclared(what: str) -> types.ErrorData:
    return types.ErrorData(
        code=types.INVALID_REQUEST,
        message=f"agent-gateway: the client did not declare the capability for {what}",
    )


def result_type(request: types.InputRequest) -> type[types.InputResponse]:
    """The result model of an input request, as the client's answer is validated."""
    if isinstance(request, types.CreateMessageRequest):
        with_tools = request.params.tools is not None or request.params.tool_choice is not None
        return types.CreateMessageResultWithTools if with_tools else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    return types.ListRootsResult


MAX_WAITING = 16
"""A client's requests from its upstreams, outside any call, it has not answered yet, at most."""
ASK_TIMEOUT = 300.0
"""Seconds each of them waits for the client's answer (as a held call's question does)."""


class Waiting(Protocol):
    """A session's count of the requests it has sent its client and awaits answers to."""

    waiting: int


async def asked(
    session: Waiting, send: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, Any] | types.ErrorData:
    """What ``send`` (a request to ``session``'s client outside any call: ``roots/list``,
    mostly) is answered, or the error the upstream is given instead: at most ``MAX_WAITING``
    at once, each for at most ``ASK_TIMEOUT``. A client need not answer (it need not even open
    the stream they come on), and its own notifications can make an upstream ask again as
    often as it likes: each request waited for ever, a task apiece."""
    if session.waiting >= MAX_WAITING:
        message = f"agent-gateway: the client has {MAX_WAITING} requests unanswered; not asked"
        return types.ErrorData(code=types.INTERNAL_ERROR, message=message)
    session.waiting += 1
    try:
        with anyio.move_on_after(ASK_TIMEOUT):
            return await send()
        message = f"agent-gateway: the client did not answer within {ASK_TIMEOUT:g}s"
        return types.ErrorData(code=types.REQUEST_TIMEOUT, message=message)
    except MCPError as exc:
        return exc.error
    finally:
        session.waiting -= 1
