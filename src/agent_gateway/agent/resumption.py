"""Pausing and resuming an ``ask_agent`` run across a modern client's ``InputRequiredResult``
rounds: what the ``requestState`` names, and what the graph resumes with."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, Interrupt

from agent_gateway.agent.asking import LATE, Pause, responses_value
from agent_gateway.agent.graph import AgentGraph
from agent_gateway.downstream.caller import Caller
from agent_gateway.errors import AgentError


@dataclass(frozen=True)
class Resumption:
    """A paused run, as the ``requestState`` of its ``InputRequiredResult`` names it.

    The state is sealed by the MCP server's request-state boundary (authentic, unexpired,
    bound to this tool call's arguments); the token further ties it to the thread's latest
    pause, so an answer to an older pause, or a second answer to this one, resumes nothing.
    """

    thread: str
    run: str
    token: str
    started: str
    answers: dict[str, Any] = dataclasses.field(default_factory=dict[str, Any])
    """The client's answers (plain JSON), which the paused interrupt returns on resume."""

    @classmethod
    def of(cls, caller: Caller | None) -> Resumption | None:
        """The run ``caller`` resumes, or None for a new run.

        Raises:
            AgentError: the request state is not one an ``ask_agent`` pause issued.
        """
        if caller is None or caller.request_state is None:
            return None
        try:
            state = json.loads(caller.request_state)
            named = (str(state["thread"]), str(state["run"]), str(state["token"]), str(state["started"]))
        except (ValueError, TypeError, KeyError):
            raise AgentError(
                "the request state is not one this agent issued; call again without it"
            ) from None
        return cls(*named, answers=responses_value(caller.input_responses))

    def encode(self) -> str:
        state = {"thread": self.thread, "run": self.run, "token": self.token, "started": self.started}
        return json.dumps(state, separators=(",", ":"))


async def resume_input(graph: AgentGraph, config: RunnableConfig, resumed: Resumption) -> Command[Any]:
    """What resumes ``resumed``: the client's answers, if its thread still waits for them.

    Raises:
        AgentError: the thread's latest pause is not this one.
    """
    state = await graph.aget_state(config)
    pending = [p for p in map(Pause.of_value, (i.value for i in state.interrupts)) if p is not None]
    pause = next((p for p in pending if p.token == resumed.token), None)
    if pause is None:
        raise AgentError(
            f"run {resumed.run} is no longer waiting for this answer (it was answered already, or a "
            f"later run on thread {resumed.thread} replaced it); call again without the request state"
        )
    if pause.late():  # as a handshake-era client's answer after the wait: none came in time
        return Command(resume={LATE: True})
    return Command(resume=resumed.answers)


def pause_of(final: Mapping[str, Any]) -> Pause | None:
    interrupts: list[Interrupt] = final.get("__interrupt__") or []
    return next((p for p in map(Pause.of_value, (i.value for i in interrupts)) if p is not None), None)
