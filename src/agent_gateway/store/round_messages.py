"""What replicas say to each other about a held call's round (``store/rounds.py``), checked
as it is heard: a message another replica's bug made malformed is dropped with a warning,
never a failure of the replica that heard it.

To the holder, on its channel: ``round`` (a retry's answers and what its request is) and
``cancel`` (its client gave it up). Back to the asking replica, on its channel: ``serving``
(the holder still works on it, every ``KEEPALIVE`` seconds), ``progress`` and ``log`` (what
the round sent its client meanwhile), then ``outcome`` or ``error`` (the round's end).
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent_gateway.downstream.held_rounds import ToolResult

logger = logging.getLogger(__name__)

KEEPALIVE = 2.0
"""Seconds between a holder's ``serving`` messages while it serves a round."""


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    """The round, as the asking replica numbered it."""


class Asked(_Message):
    """A round sent to the replica holding its call."""

    op: Literal["round"] = "round"
    sender: str
    """The asking replica."""
    token: str
    tool: str
    client: str
    """The retry's client (its label): the held call must be this client's."""
    session: str = ""
    answers: types.InputResponses = Field(default_factory=dict)
    capabilities: types.ClientCapabilities | None = None
    log_level: types.LoggingLevel | None = None
    progress: bool = False
    """Whether the retry asked for progress."""
    trace: dict[str, str] = Field(default_factory=dict)
    """The asking replica's trace context (W3C headers)."""


class Cancel(_Message):
    op: Literal["cancel"] = "cancel"
    sender: str


class Serving(_Message):
    op: Literal["serving"] = "serving"


class Progress(_Message):
    op: Literal["progress"] = "progress"
    progress: float
    total: float | None = None
    message: str | None = None


class Log(_Message):
    op: Literal["log"] = "log"
    upstream: str
    params: types.LoggingMessageNotificationParams


class Outcome(_Message):
    op: Literal["outcome"] = "outcome"
    result: ToolResult


class Failed(_Message):
    op: Literal["error"] = "error"
    code: int
    message: str


Message = Annotated[Asked | Cancel | Serving | Progress | Log | Outcome | Failed, Field(discriminator="op")]
_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)


def parsed(text: str) -> Message | None:
    """The message ``text`` is, or None (logged) when it is none of them."""
    try:
        return _MESSAGE.validate_json(text)
    except ValidationError as exc:
        logger.warning(
            "held calls' rounds: a message dropped, not understood (%d error(s))", exc.error_count()
        )
        return None


def said(message: _Message) -> str:
    """``message`` as it goes on a channel."""
    return message.model_dump_json(by_alias=True, exclude_none=True)
