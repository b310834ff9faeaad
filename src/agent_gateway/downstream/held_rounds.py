"""What a held call's rounds are made of, shared with the replicas' channels (``store/rounds``):
the request serving one round, and where a round of a call another replica holds is served."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import mcp_types as types

from agent_gateway.access import Principal
from agent_gateway.downstream.caller import Caller
from agent_gateway.upstreams.client_side import ClientSide

ToolResult = types.CallToolResult | types.InputRequiredResult
Start = Callable[[ClientSide], Awaitable[ToolResult]]
"""Begins the upstream call on behalf of the client side it is given."""


class RoundRequest(ClientSide, Protocol):
    """The request serving one round: a ``Caller`` here, or another replica's (``store/rounds``)."""

    @property
    def client(self) -> Principal | None:
        """Who asked (the held call's own client)."""

    @property
    def progress_token(self) -> types.ProgressToken | None:
        """The request's progress token (None: it asked for no progress)."""


class Rounds(Protocol):
    """Where a round of a call another replica holds is served (``store/rounds.Rounds``)."""

    async def round(self, elsewhere: Elsewhere, caller: Caller) -> ToolResult:
        """The round's outcome, served by ``elsewhere.replica``."""
        ...  # a Protocol member: the signature is the contract


@dataclass(frozen=True)
class Elsewhere:
    """A retry's held call, held by another replica."""

    replica: str
    token: str
    tool: str
