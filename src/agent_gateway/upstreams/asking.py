"""Who is asking: a question an upstream puts to a client through the gateway names that upstream.

MCP asks a client to make clear which server requests information from its user (elicitation),
and a client shows the server it is connected to: behind the gateway, the gateway, whichever
of its upstreams asked. A form from any of twenty upstreams looked alike, and one could ask in
another's name ("GitHub needs your token to go on"). Each question relayed to a client now says
its upstream: an elicitation's message (form or URL, and each URL elicitation a -32042 error
lists) begins with ``[name] ``, which the client shows its user; and every question's ``_meta``
(elicitation, sampling, roots) holds ``io.agent-gateway/upstream``, replacing whatever the
upstream put under that key itself. A sampling request's messages are the model's input, and
stay as they came.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import mcp_types as types

from agent_gateway.meta_keys import ASKER_META_KEY

_Result = TypeVar("_Result", bound=types.Result)


def asked_by(upstream: str, request: types.InputRequest) -> types.InputRequest:
    """``request`` as a client is asked it: naming ``upstream``, the one that asks."""
    had = request.params.meta if request.params is not None else None
    meta: dict[str, Any] = {**(had or {}), ASKER_META_KEY: upstream}
    if isinstance(request, types.ElicitRequest):
        said = _said(upstream, request.params.message)
        return types.ElicitRequest(params=request.params.model_copy(update={"message": said, "meta": meta}))
    if isinstance(request, types.CreateMessageRequest):
        return types.CreateMessageRequest(params=request.params.model_copy(update={"meta": meta}))
    return types.ListRootsRequest(params=types.RequestParams.model_validate({"_meta": meta}))


def named(upstream: str, result: _Result) -> _Result:
    """A modern upstream's result as its modern caller gets it: the requests of an
    ``InputRequiredResult`` each naming ``upstream``; any other result as it is."""
    if not isinstance(result, types.InputRequiredResult) or not result.input_requests:
        return result
    asked = {key: asked_by(upstream, request) for key, request in result.input_requests.items()}
    return cast(_Result, result.model_copy(update={"input_requests": asked}))


def listing_by(upstream: str, data: Any) -> Any:
    """A -32042 error's ``data``: each URL elicitation it lists with its message naming ``upstream``
    (an entry of another shape, or with no string message, as it is)."""
    if not isinstance(data, dict) or not isinstance(listed := data.get("elicitations"), list):
        return data
    return {**data, "elicitations": [_entry(upstream, entry) for entry in listed]}


def _entry(upstream: str, entry: Any) -> Any:
    if isinstance(entry, dict) and isinstance(message := entry.get("message"), str):
        return {**entry, "message": _said(upstream, message)}
    return entry


def _said(upstream: str, message: str) -> str:
    return f"[{upstream}] {message}"
