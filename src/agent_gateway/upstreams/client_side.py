"""The client side of a call, as the upstream layer sees it: a ``downstream.caller.Caller``
(one request) or a ``downstream.sessions.DownstreamSession`` (the owner of a dedicated
upstream session) satisfies it, so the upstream layer imports nothing of the client side."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT


class ClientSide(Protocol):
    """What the upstream layer may ask of the client side of a call."""

    @property
    def session_id(self) -> str:
        """The gateway session id of the client."""
        ...  # a Protocol member: the signature is the contract

    @property
    def log_level(self) -> types.LoggingLevel | None:
        """The lowest level the client wants log lines at; ``None``: it asked for none."""

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        """What the client declared it can answer (sampling, elicitation, roots)."""

    @property
    def modern(self) -> bool:
        """Whether the client speaks the modern (2026-07-28) era on this call."""
        ...  # a Protocol member: the signature is the contract

    @property
    def input_responses(self) -> types.InputResponses | None:
        """A modern client's answers to the input requests of its previous round."""

    @property
    def request_state(self) -> str | None:
        """The opaque state a modern client echoes back with its answers."""

    @property
    def client_meta(self) -> Mapping[str, Any]:
        """The client's own ``_meta`` keys of its request (``meta_keys``), passed on upstream."""
        ...  # a Protocol member: the signature is the contract

    def progress_relay(self) -> ProgressFnT | None:
        """Where upstream progress for this call goes, if the client asked for progress."""

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        """Deliver one upstream log line to the client (filtered by its level)."""

    async def ask(self, upstream: str, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        """Relay a sampling, elicitation or roots request to the client and return its answer."""
        ...  # a Protocol member: the signature is the contract

    async def elicitation_complete(
        self, upstream: str, params: types.ElicitCompleteNotificationParams, *, during_call: bool
    ) -> None:
        """Tell a handshake-era client that can elicit by URL that the upstream's URL-mode
        elicitation ``params`` names is complete (2025-11-25); others are told nothing.
        ``during_call``: this client side's call is still in flight (else only its session
        is left to tell)."""

    @property
    def lasting(self) -> ClientSide:
        """What is left to tell once this client side's call has ended: its session (a
        session is its own), which holds nothing of the request (its ``_meta``, its answers)."""
        ...  # a Protocol member: the signature is the contract


EVERYTHING = types.ClientCapabilities(
    sampling=types.SamplingCapability(tools=types.SamplingToolsCapability()),
    elicitation=types.ElicitationCapability(
        form=types.FormElicitationCapability(), url=types.UrlElicitationCapability()
    ),
    roots=types.RootsCapability(list_changed=True),
)
"""What an upstream session shared by several client sides is told they can answer: each
request is then refused what its own client cannot."""
