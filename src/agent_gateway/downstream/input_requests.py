"""What a client can be asked during a call (sampling, elicitation, roots): whether it
declared it can answer, and the model its answer is read as."""

from __future__ import annotations

import mcp_types as types
from mcp.server.validation import check_sampling_tools_capability, wants_sampling_tools


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
