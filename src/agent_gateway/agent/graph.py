"""The agent's LangGraph graph: a model node and a tools node joined by a conditional edge.

The graph is compiled once; everything that belongs to one run — the model, its toolbox (the
catalog snapshot and the client's policy), the client's request, where progress goes —
arrives as the run's context, so one compiled graph serves every client at once. Which tools
a model call is offered is part of the thread's state (``offered``), chosen at the run's first
model turn and widened by the model's own ``search_tools`` calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypedDict

import anyio
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, RemoveMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphBubbleUp
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command
from langsmith import tracing_context

from agent_gateway.agent.calls import ToolRunner, taken
from agent_gateway.agent.memory import model_view, out_of_view
from agent_gateway.agent.provider_http import refusal, unreached
from agent_gateway.agent.reporting import RunObserver, ToolCallRecord
from agent_gateway.agent.results import linked
from agent_gateway.agent.run_record import MAX_OFFERED_NAMES, kept_calls
from agent_gateway.agent.spans import chat_span
from agent_gateway.agent.toolbox import system_prompt
from agent_gateway.agent.turn_bound import fitted, turn_limit, within_reach
from agent_gateway.errors import AgentError, ModelFailed
from agent_gateway.logs import scrubbed

logger = logging.getLogger(__name__)


class Usage(TypedDict):
    input_tokens: int
    output_tokens: int


class AgentState(TypedDict):
    """A thread's state. ``messages`` persist across runs; the rest is reset by each run's input."""

    messages: Annotated[list[AnyMessage], add_messages]
    steps: int
    usage: Usage
    tool_calls: list[ToolCallRecord]
    """The run's first tool calls, within the record's budget (``run_record.MAX_CALLS_JSON``)."""
    tool_calls_left_out: int
    """The run's tool calls past that budget."""
    offered: list[str]
    """The catalog tools the next model call binds (empty at a run's start: chosen then)."""
    offered_seen: list[str]
    """The first ``MAX_OFFERED_NAMES`` tools offered during the run, for its record (the state
    is stored at every step: all of them were up to 12,700 names)."""
    offered_count: int
    """How many tools were offered during the run (past the names kept, one dropped and
    offered again counts twice)."""
    offered_last: list[str]
    """What the last model call was offered, as it was (a name in it is not counted again)."""


@dataclass(frozen=True)
class RunContext:
    """What one run brings to the shared graph."""

    model: BaseChatModel
    model_name: str
    """The configured model's name, for spans (the reply may name the one that answered)."""
    provider: str
    tools: ToolRunner
    observer: RunObserver
    instructions: str
    """The agent's own instructions; the offered tools' upstreams' follow them."""
    max_steps: int
    max_context_tokens: int
    scrub: tuple[str, ...] = field(default=(), repr=False)
    """Strings (secrets) that must not appear in an error message."""
    deadline: float | None = None
    """Seconds a model call may take in all (``ModelSource.deadline``; None: unbounded here)."""
    charge: Callable[[int], None] = field(default=lambda _: None, repr=False)
    """Counts a model turn's tokens against the client's budget as the turn ends: a run
    cancelled (or paused, then resumed) later is charged each turn once, and no turn twice."""


AgentGraph = CompiledStateGraph[AgentState, RunContext, Any, Any]


def run_input(query: str) -> dict[str, Any]:
    """The input of one run: the user's message, and the per-run counters reset."""
    return {
        "messages": [("user", query)],
        "steps": 0,
        "usage": Usage(input_tokens=0, output_tokens=0),
        "tool_calls": [],
        "tool_calls_left_out": 0,
        "offered": [],
        "offered_seen": [],
        "offered_count": 0,
        "offered_last": [],
    }


def build_graph(checkpointer: BaseCheckpointSaver[str]) -> AgentGraph:
    """The compiled graph, keeping threads in ``checkpointer``."""

    async def model(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        run = runtime.context
        step = state["steps"] + 1
        await run.observer.model_turn(step)
        history = state["messages"]
        offered = state.get("offered") or await run.tools.choose(history)
        prompt = system_prompt(run.instructions, run.tools.toolbox, offered)
        view = model_view(prompt, history, run.max_context_tokens)
        within_reach(view, run.max_context_tokens)
        specs = run.tools.toolbox.specs(offered, reading=bool(linked(view)))
        bound = run.model.bind_tools(specs) if specs else run.model
        with chat_span(run.provider, run.model_name, pausing=(GraphBubbleUp,)) as call:
            reply = taken(await _reply(bound, view, run.scrub, run.deadline))
            usage = reply.usage_metadata or {}
            call.answered(
                reply.response_metadata.get("model_name"),
                usage.get("input_tokens", 0),
                usage.get("output_tokens", 0),
            )
        run.charge(usage.get("input_tokens", 0) + usage.get("output_tokens", 0))
        forget = [RemoveMessage(id=m.id) for m in out_of_view(history, view) if m.id]
        return {
            "messages": [*forget, reply],
            "steps": step,
            "usage": _added(state["usage"], reply),
            "offered": offered,
            # As the model was offered them: search_tools and read_resource too, when bound.
            **_seen(state, [s["function"]["name"] for s in specs]),
        }

    async def tools(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        run, history = runtime.context, state["messages"]
        last = history[-1]
        assert isinstance(last, AIMessage)  # routed here only after a model turn with calls
        runner, before = run.tools, state.get("offered") or []
        # The model's reply may have taken the turn past its bound: then no call is run.
        left = within_reach(_next_view(run, history, before), run.max_context_tokens)
        outcomes, found = await runner.run(last.tool_calls, last.invalid_tool_calls, linked(history))
        offered = runner.widened(before, found)
        if offered != before:  # the next view's system prompt describes other tools: counted again
            left = within_reach(_next_view(run, history, offered), run.max_context_tokens)
        # The next model call's view, these results aside: they take at most what is left.
        outcomes = fitted(outcomes, left, turn_limit(run.max_context_tokens))
        made = (record for _, record in outcomes)
        recorded, left_out = kept_calls(state["tool_calls"], made, state.get("tool_calls_left_out", 0))
        return {
            "messages": [message for message, _ in outcomes],
            "tool_calls": recorded,
            "tool_calls_left_out": left_out,
            "offered": offered,
        }

    def route(state: AgentState, runtime: Runtime[RunContext]) -> Literal["tools", "__end__"]:
        last = state["messages"][-1]
        wants_tools = isinstance(last, AIMessage) and bool(last.tool_calls or last.invalid_tool_calls)
        # At the step limit the run ends with the calls unanswered; the runner reports it.
        return "tools" if wants_tools and state["steps"] < runtime.context.max_steps else "__end__"

    graph = StateGraph(AgentState, context_schema=RunContext)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer, name="agent-gateway")


async def _reply(
    model: Runnable[Any, Any], view: list[AnyMessage], scrub: tuple[str, ...], deadline: float | None
) -> AIMessage:
    try:
        with anyio.fail_after(deadline):
            reply = await model.ainvoke(view)
    except (AgentError, GraphBubbleUp):  # GraphBubbleUp: the run pauses to ask the client
        raise
    except TimeoutError as exc:
        raise ModelFailed(
            f"the model did not answer within {deadline:g}s "
            f"(agent.model.timeout for each of 1 + agent.model.max_retries attempts)"
        ) from exc
    except Exception as exc:  # any provider failure ends the run as a clear isError result
        if (refused := refusal(exc)) is not None:
            raise ModelFailed(f"the model call failed: {refused}") from exc
        if (told := unreached(exc)) is not None:
            logger.warning(
                "agent: the model call failed: %s", scrubbed(f"{type(exc).__name__}: {exc}", scrub)
            )
            raise ModelFailed(f"the model call failed: {told}") from exc
        raise ModelFailed(scrubbed(f"the model call failed: {type(exc).__name__}: {exc}", scrub)) from exc
    if not isinstance(reply, AIMessage):
        raise ModelFailed(f"the model returned {type(reply).__name__}, not an AI message")
    return reply


def _seen(state: AgentState, names: list[str]) -> dict[str, Any]:
    """The run's offered tools counted and kept (``offered_seen``, bounded) with ``names``, the
    tools of this model call."""
    seen = state.get("offered_seen") or []
    known = {*seen, *(state.get("offered_last") or [])}
    new = [n for n in dict.fromkeys(names) if n not in known]
    return {
        "offered_seen": [*seen, *new[: max(0, MAX_OFFERED_NAMES - len(seen))]],
        "offered_count": (state.get("offered_count") or len(seen)) + len(new),
        "offered_last": names,
    }


def _next_view(run: RunContext, history: list[AnyMessage], offered: list[str]) -> list[AnyMessage]:
    """What the next model call would be sent of ``history`` (its system prompt included)."""
    return model_view(
        system_prompt(run.instructions, run.tools.toolbox, offered), history, run.max_context_tokens
    )


async def invoked(
    graph: AgentGraph,
    start: dict[str, Any] | Command[Any],
    config: RunnableConfig,
    context: RunContext,
    within: float,
    deadline: float,
) -> dict[str, Any]:
    """The run's final state, or ``AgentError`` at ``deadline``, the end of the request's
    ``within`` seconds (``agent.run_timeout``, its wait for the thread included): the model
    call or tool calls in flight are cancelled, the upstreams told."""
    with anyio.CancelScope(deadline=deadline) as bound:
        # LangChain would send every message to LangSmith if its variables are set.
        with tracing_context(enabled=False):
            # "sync": each step is stored before the next begins, so a cancelled run's tool
            # calls stay in the thread (with "async" or "exit" the last write is lost).
            return await graph.ainvoke(start, config, context=context, durability="sync")
    assert bound.cancelled_caught  # only a return or the bound leaves the scope
    raise AgentError(
        f"the run did not end within {within:g}s (agent.run_timeout): "
        f"its model call or tool calls in flight were cancelled"
    )


def recursion_limit(max_steps: int) -> int:
    """LangGraph's own super-step bound, above ours so that ours is the one that ends a run."""
    return 2 * max_steps + 4


def _added(usage: Usage, reply: AIMessage) -> Usage:
    meta = reply.usage_metadata
    if meta is None:
        return usage
    return Usage(
        input_tokens=usage["input_tokens"] + meta.get("input_tokens", 0),
        output_tokens=usage["output_tokens"] + meta.get("output_tokens", 0),
    )
