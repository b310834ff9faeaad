"""How a run asks its client something (the client's model, an approval), in either protocol era.

A handshake-era client is asked by a request on its session, while the run waits. A modern
(2026-07-28) client cannot be sent requests: the run pauses instead. ``RoundAsker`` raises a
LangGraph interrupt carrying the requests; the graph's state is stored in the thread's
checkpoint, the tool answers with an ``InputRequiredResult``, and the client's retry, carrying
the answers, resumes the graph, where the interrupt now returns them. A node that asks is
re-run from its start on resume, so every node asks before it does anything it must not do
twice (the tools node asks all its approvals first, then calls the tools).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import anyio
import mcp_types as types
from langgraph.types import interrupt
from pydantic import TypeAdapter, ValidationError

from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.input_requests import result_type, unsupported
from agent_gateway.errors import cut_client_error

ANSWERS = "answers"
LATE = "late"
"""In the resume value: the client answered after the pause's ``wait_limit`` (its answers count
for nothing, as a handshake-era client's late answer does)."""
Answer = types.InputResponse | types.ErrorData | None
"""What came back for one request: the client's answer, its refusal, or None (no answer in time)."""

logger = logging.getLogger(__name__)
_REQUEST: TypeAdapter[types.InputRequest] = TypeAdapter(types.InputRequest)


@runtime_checkable
class Asker(Protocol):
    """Asks the client several things at once; the answers are keyed as the requests were."""

    async def ask(
        self, requests: Mapping[str, types.InputRequest], wait_limit: float
    ) -> dict[str, Answer]: ...


class SessionAsker:
    """A handshake-era client: each request sent on its session, concurrently, each bounded."""

    def __init__(self, caller: Caller, name: str) -> None:
        self._caller = caller
        self._name = name

    async def ask(self, requests: Mapping[str, types.InputRequest], wait_limit: float) -> dict[str, Answer]:
        answers: dict[str, Answer] = dict.fromkeys(requests)

        async def one(key: str, request: types.InputRequest) -> None:
            with anyio.move_on_after(wait_limit):
                try:
                    answer = await self._caller.ask(self._name, request)
                    # Cut as an upstream gets it: a 1 MB error went whole to the model and
                    # into the thread the run keeps.
                    answers[key] = cut_client_error(answer) if isinstance(answer, types.ErrorData) else answer
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    answers[key] = types.ErrorData(code=types.INTERNAL_ERROR, message="the client went away")
                except ValidationError as exc:  # the client's bad answer: its error, not ours
                    logger.warning(
                        "the client's answer to %s is malformed: %d problem(s)",
                        request.method,
                        exc.error_count(),
                    )
                    answers[key] = types.ErrorData(
                        code=types.INVALID_PARAMS, message=f"malformed answer: {exc.error_count()} problem(s)"
                    )
                except Exception as exc:  # one failed question must not fail the others as a group
                    logger.exception("asking the client %s failed", request.method)
                    answers[key] = types.ErrorData(
                        code=types.INTERNAL_ERROR, message=f"{type(exc).__name__}: {exc}"
                    )

        async with anyio.create_task_group() as tg:
            for key, request in requests.items():
                tg.start_soon(one, key, request)
        return answers


class RoundAsker:
    """A modern client: the run pauses (a LangGraph interrupt) until the client's retry answers.

    ``token`` marks this round's pause; the retry must bring it back (in ``requestState``) for
    the run to resume, so only the latest pause of a thread can be answered, and only once.
    """

    def __init__(self, token: str, capabilities: types.ClientCapabilities | None) -> None:
        self._token = token
        self._capabilities = capabilities

    async def ask(self, requests: Mapping[str, types.InputRequest], wait_limit: float) -> dict[str, Answer]:
        # A request the client did not declare it can answer would fail its whole call.
        answers: dict[str, Answer] = {k: unsupported(self._capabilities, r) for k, r in requests.items()}
        asked = {k: r for k, r in requests.items() if answers[k] is None}
        if asked:
            # Plain JSON in the checkpoint: the store's serializer need not know MCP's types.
            pause = Pause(
                token=self._token,
                requests={k: _wire(r) for k, r in asked.items()},
                until=time.time() + wait_limit,  # wall clock: the retry may come to another replica
            )
            given: Any = interrupt(pause.as_value())
            if isinstance(given, Mapping) and given.get(LATE):  # pyright: ignore[reportUnknownMemberType]
                return answers | dict.fromkeys(asked)  # no answer in time
            answered = given.get(ANSWERS) if isinstance(given, Mapping) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
            raw: Mapping[str, Any] = answered if isinstance(answered, Mapping) else {}  # pyright: ignore[reportUnknownVariableType]
            answers |= {key: _answer(request, raw.get(key)) for key, request in asked.items()}
        return answers


class Pause:
    """What a paused run waits for: stored as the interrupt's value, sent as the input requests."""

    def __init__(self, token: str, requests: dict[str, dict[str, Any]], until: float | None = None) -> None:
        """``until``: the wall-clock time (seconds since the epoch) after which an answer is
        too late (None: a pause stored before pauses had one)."""
        self.token = token
        self.requests = requests
        self.until = until

    def as_value(self) -> dict[str, Any]:
        return {"token": self.token, "requests": self.requests, "until": self.until}

    def late(self) -> bool:
        return self.until is not None and time.time() > self.until

    @classmethod
    def of_value(cls, value: object) -> Pause | None:
        """The pause an interrupt's value describes, or None if it is not one of ours."""
        if not isinstance(value, Mapping):
            return None
        token, requests = value.get("token"), value.get("requests")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if not isinstance(token, str) or not isinstance(requests, dict):
            return None
        until = value.get("until")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        return cls(token, dict(requests), float(until) if isinstance(until, int | float) else None)  # pyright: ignore[reportUnknownArgumentType]

    def input_requests(self) -> types.InputRequests:
        return {key: _REQUEST.validate_python(raw) for key, raw in self.requests.items()}


def responses_value(responses: types.InputResponses | None) -> dict[str, Any]:
    """The client's answers as the resume value of a pause (plain JSON, like the pause itself).

    Wrapped: LangGraph reads a bare mapping as answers keyed by interrupt id, and an empty
    one (a retry without answers) would resume nothing and pause again, for ever.
    """
    answers = {
        key: r.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key, r in (responses or {}).items()
    }
    return {ANSWERS: answers}


def _wire(request: types.InputRequest) -> dict[str, Any]:
    return request.model_dump(mode="json", by_alias=True, exclude_none=True)


def _answer(request: types.InputRequest, raw: Any) -> Answer:
    if raw is None:
        return types.ErrorData(
            code=types.INVALID_PARAMS, message=f"the client's retry carried no answer to {request.method}"
        )
    try:
        return result_type(request).model_validate(raw)
    except ValidationError as exc:
        reason = exc.errors(include_url=False)[0]["msg"]
        return types.ErrorData(
            code=types.INVALID_PARAMS,
            message=f"the client's answer to {request.method} is malformed: {reason}",
        )
