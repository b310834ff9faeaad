"""What a client can be asked during a call (sampling, elicitation, roots): whether it
declared it can answer, and the model its answer is read as."""

from __future__ import annotations

import mcp_types as types


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
        return types.ErrorData(
            code=types.INVALID_REQUEST,
            message=f"agent-gateway: the client did not declare the capability for {request.method}",
        )
    return None


def result_type(request: types.InputRequest) -> type[types.InputResponse]:
    """The result model of an input request, as the client's answer is validated."""
    if isinstance(request, types.CreateMessageRequest):
        with_tools = request.params.tools is not None or request.params.tool_choice is not None
        return types.CreateMessageResultWithTools if with_tools else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    return types.ListRootsResult
