"""One ``ask_agent`` run, start to finish: thread, model, graph, and the record it returns.

Every way a run can fail ends here as a ``RunOutcome`` with an error message and the partial
record (steps taken, tool calls made, tokens used); nothing raises out of ``AgentRunner.run``
but cancellation.
"""

from __future__ import annotations

import logging
import secrets
import traceback
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from agent_gateway import access
from agent_gateway.activity import Activity, RunStatus
from agent_gateway.agent.asking import Asker, Pause, RoundAsker, SessionAsker
from agent_gateway.agent.calls import ToolRunner
from agent_gateway.agent.graph import (
    AgentGraph,
    RunContext,
    build_graph,
    invoked,
    recursion_limit,
    run_input,
)
from agent_gateway.agent.memory import Conversations
from agent_gateway.agent.models import ModelSource
from agent_gateway.agent.reporting import ClientObserver, LogObserver, RecordedObserver, RunObserver
from agent_gateway.agent.request import AgentRequest
from agent_gateway.agent.resumption import Resumption, pause_of, resume_input
from agent_gateway.agent.run_record import answered, error_text, fill, final_answer, new_record, now
from agent_gateway.agent.spans import agent_finished, agent_span
from agent_gateway.agent.threads import holds, owner_of, thread_of
from agent_gateway.agent.toolbox import Reach, Toolbox, searcher
from agent_gateway.agent.upkeep import Exclusive, Upkeep, Vacant
from agent_gateway.call_records import CallRecorder
from agent_gateway.catalog import Catalog
from agent_gateway.config import AgentConfig
from agent_gateway.downstream.caller import Caller
from agent_gateway.errors import AgentError, StepLimitReached
from agent_gateway.logs import scrubbed
from agent_gateway.proxy import Proxy
from agent_gateway.search.engine import ToolSearch

logger = logging.getLogger(__name__)

_READ_TIMEOUT = 5.0


@dataclass(frozen=True)
class RunOutcome:
    """What a run returns: ``record`` is the tool's ``structuredContent``.

    A run paused to ask a modern client something returns ``pending`` instead: the tool's
    answer is then that ``InputRequiredResult``, and the client's retry resumes the run.
    """

    record: dict[str, Any]
    error: str | None = None
    pending: types.InputRequiredResult | None = None

    @property
    def text(self) -> str:
        return self.error if self.error is not None else str(self.record["answer"])


@dataclass(frozen=True)
class _Run:
    """One run once its graph and context are ready: what its steps on the thread share."""

    graph: AgentGraph
    context: RunContext
    record: dict[str, Any]
    request: AgentRequest
    resumed: Resumption | None
    token: str
    owner: str  # whose thread it is (``owner_of``)
    deadline: float  # ``anyio.current_time()`` at which the request ends, its wait included


class AgentRunner:
    """Runs the agent for any number of concurrent callers. Use ``async with runner.running():``."""

    def __init__(
        self,
        config: AgentConfig,
        catalog: Catalog,
        proxy: Proxy,
        chat_model: BaseChatModel | None = None,
        search: ToolSearch | None = None,
        activity: Activity | None = None,
        exclusive: Exclusive | None = None,
        vacant: Vacant | None = None,
        recorder: CallRecorder | None = None,
    ) -> None:
        """``search``: the tool index, for toolboxes larger than ``agent.max_tools``;
        ``exclusive``: a thread held by one run across replicas (their memory shared);
        ``vacant``: the same, taken only if free (for deleting a thread no run is on);
        ``recorder``: where each tool call a run makes is recorded as its client's.

        Raises ``ConfigError`` when the configured model provider refuses its settings.
        """
        self.config = config
        self._activity = activity or Activity()  # without one (the CLI), a record no page reads
        self._catalog = catalog
        self._proxy = proxy
        self._search = search
        self._models = ModelSource(config.model, chat_model)
        self._conversations = Conversations(config.memory)
        self._graph: AgentGraph | None = None
        self._reach = Reach(config)
        self._lock = anyio.Lock()
        self._upkeep = Upkeep(self._conversations, vacant, exclusive)
        self._recorder = recorder or CallRecorder(self._activity, "none")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[AgentRunner]:
        try:
            async with self._conversations, anyio.create_task_group() as tg:
                tg.start_soon(self._upkeep.sweep)
                tg.start_soon(self._conversations.watch)
                yield self
                tg.cancel_scope.cancel()
        finally:
            await self._models.aclose()

    @property
    def memory_problem(self) -> str | None:
        """Why conversation memory cannot be used now (its shared database is down), or None."""
        return self._conversations.problem

    def toolbox(self, client: access.Principal) -> tuple[Toolbox, tuple[str, ...]]:
        """The toolbox of a run for ``client`` in the current catalog, and its tools' names
        when it is small enough to offer whole."""
        snapshot = self._catalog.snapshot
        allowed = client.tool_filter()
        size, names = self._reach.of(snapshot, client.policy_key, allowed)
        # A toolbox of few tools not offered whole is one whose definitions are too large.
        return Toolbox(snapshot, self.config, allowed, size, wide=len(names) < size), names

    async def run(
        self,
        request: AgentRequest,
        client: access.Principal,
        caller: Caller | None,
        observer: RunObserver | None = None,
    ) -> RunOutcome:
        """Run the agent on ``request`` for ``client``, asked through ``caller`` (None: no MCP
        client, e.g. the CLI, whose client is ``access.OPERATOR``). A caller whose
        ``request_state`` is one this runner issued resumes that paused run."""
        try:
            resumed = _of_client(Resumption.of(caller), client)
        except AgentError as exc:
            outcome = _failure(new_record("", "", self._models.label), str(exc))
            _log_end(outcome)
            return outcome
        run_id = resumed.run if resumed else uuid.uuid4().hex
        thread = resumed.thread if resumed else thread_of(request.conversation_id, client, caller, run_id)
        record = new_record(thread, run_id, self._models.label, resumed.started if resumed else None)
        log = LogObserver(run_id)
        report: RunObserver = observer or (ClientObserver(caller, self.config.name, log) if caller else log)
        # The status page keeps each run, with its steps as they happen.
        kept = self._activity.run_started(run_id, thread, client.subject)
        report = RecordedObserver(kept, report)
        token = secrets.token_urlsafe(16)
        deadline = anyio.current_time() + self.config.run_timeout  # the request's, its wait included
        try:
            with agent_span(self.config.name, run_id, thread) as span:
                logger.info(
                    "agent run %s %s (thread %s)", run_id, "resumed" if resumed else "started", thread
                )
                try:
                    _refuse_if_down(self.memory_problem)
                    graph = await self._compiled()
                    context = self._context(client, caller, report, token, run_id)
                except AgentError as exc:
                    outcome = _failure(record, str(exc))
                else:
                    run = _Run(graph, context, record, request, resumed, token, owner_of(client), deadline)
                    outcome = await self._held(run)
                agent_finished(span, _status(outcome), outcome.error)
        except anyio.get_cancelled_exc_class():
            kept.finish("cancelled", "cancelled before it ended (by the client, or the gateway stopping)")
            logger.info("agent run %s cancelled (thread %s)", run_id, thread)
            raise
        kept.finish(_status(outcome), outcome.record["error"])
        _log_end(outcome)
        return outcome

    async def _held(self, run: _Run) -> RunOutcome:
        """The run once its thread is held for its client, waited for until its deadline at most."""
        thread = run.record["thread_id"]
        try:
            async with self._upkeep.held(thread, run.deadline, self.config.run_timeout):
                await self._conversations.used(thread, run.owner)
                await self._upkeep.make_room(run.owner)
                try:
                    return await self._on_thread(run)
                finally:  # a cancelled run's steps too (shielded, time-bounded)
                    await self._conversations.compact(thread)
        except AgentError as exc:  # the thread stayed busy
            return _failure(run.record, str(exc))

    async def _on_thread(self, run: _Run) -> RunOutcome:
        """The run, under its thread's lock: started, or resumed if the thread still waits for it."""
        config = RunnableConfig(
            configurable={"thread_id": run.record["thread_id"]},
            recursion_limit=recursion_limit(self.config.max_steps),
        )
        try:
            start = (
                await resume_input(run.graph, config, run.resumed)
                if run.resumed
                else run_input(run.request.text)
            )
        except AgentError as exc:  # not this run's state to report: the thread has moved on
            return _failure(run.record, str(exc))
        return await self._invoke(run, config, start)

    async def _invoke(
        self, run: _Run, config: RunnableConfig, start: dict[str, Any] | Command[Any]
    ) -> RunOutcome:
        graph, context, record = run.graph, run.context, run.record
        try:
            final = await invoked(graph, start, config, context, self.config.run_timeout, run.deadline)
            if (pause := pause_of(final)) is not None:
                return _paused(record, final, pause, run.token)
            return self._finished(record, final)
        except AgentError as exc:
            message = str(exc)
            _let_go(exc)
        except Exception as exc:  # the top of a run: log the traceback, answer with a clear error
            if (lost := self._conversations.lost(exc)) is None:
                logger.exception("agent run %s failed unexpectedly", record["run_id"])
            elif self._conversations.problem is not None:  # the shared database: no partial record
                logger.warning(
                    "agent run %s failed: %s", record["run_id"], lost
                )  # (it would wait out the pool)
                return _failure(record, lost)
            message = lost or f"the agent run failed: {type(exc).__name__}: {exc}"
            _let_go(exc)
        if record["ended_at"] is None:  # not yet filled from a final state
            await _read_partial(record, graph, config)
        return _failure(record, scrubbed(message, context.scrub))

    async def _compiled(self) -> AgentGraph:
        """The graph, compiled on the first run (its checkpointer opens then)."""
        async with self._lock:
            if self._graph is None:
                self._graph = build_graph(await self._conversations.checkpointer())
            return self._graph

    def _context(
        self, client: access.Principal, caller: Caller | None, report: RunObserver, token: str, run_id: str
    ) -> RunContext:
        """The run's context: its model, and a toolbox of what the calling client may call
        (the model is shown nothing else)."""
        toolbox, names = self.toolbox(client)
        tool_caller = caller.of_runs() if caller else None
        asker = self._asker(caller, token)
        secret = self._models.secret
        return RunContext(
            model=self._models.for_run(caller, asker),
            model_name=self._models.label,
            provider=self._models.provider,
            tools=ToolRunner(
                toolbox,
                self._proxy,
                self._recorder,
                run_id,
                tool_caller,
                report,
                asker,
                self.config.approval_timeout,
                searcher(self._search, toolbox, client.label),
                names,
                client,
            ),
            observer=report,
            instructions=self.config.instructions,
            max_steps=self.config.max_steps,
            max_context_tokens=self.config.max_context_tokens,
            scrub=(secret,) if secret else (),
            deadline=self._models.deadline,
            charge=lambda tokens: client.spent.used(tokens),  # its spend now: a reload may set another
        )

    def _asker(self, caller: Caller | None, token: str) -> Asker | None:
        if caller is None:
            return None
        if caller.modern:  # no requests to a modern client: the run pauses and it retries
            return RoundAsker(token, caller.capabilities)
        return SessionAsker(caller, self.config.name)

    def _finished(self, record: dict[str, Any], final: Mapping[str, Any]) -> RunOutcome:
        fill(record, final)
        last = final["messages"][-1]
        if isinstance(last, AIMessage) and (last.tool_calls or last.invalid_tool_calls):
            raise StepLimitReached(
                f"the agent reached its step limit ({self.config.max_steps} model turns) and still wanted "
                f"to call tools; raise agent.max_steps or ask for less at once"
            )
        record["answer"] = answered(final_answer(last))
        return RunOutcome(record)


async def _read_partial(record: dict[str, Any], graph: AgentGraph, config: RunnableConfig) -> None:
    """Fill ``record`` from the run's last checkpoint (under the thread's lock, so it is this run's)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(_READ_TIMEOUT):
        try:
            fill(record, (await graph.aget_state(config)).values)
        except Exception:  # a broken store must not turn a clear error into a crash
            logger.exception("agent run %s: its partial record could not be read", record["run_id"])


def _paused(record: dict[str, Any], final: Mapping[str, Any], pause: Pause, token: str) -> RunOutcome:
    fill(record, final)
    record["ended_at"] = None
    state = Resumption(record["thread_id"], record["run_id"], token, record["started_at"]).encode()
    asked = pause.input_requests()
    logger.info(
        "agent run %s paused for the client: %s",
        record["run_id"],
        ", ".join(r.method for r in asked.values()),
    )
    return RunOutcome(record, pending=types.InputRequiredResult(input_requests=asked, request_state=state))


def _of_client(resumed: Resumption | None, client: access.Principal) -> Resumption | None:
    """``resumed`` if its thread is ``client``'s own.

    The SDK binds a sealed ``requestState`` to an authenticated client only: an anonymous
    client at another address that got hold of one resumed that run, in a space not its own
    (it answered the approval, and read the answer).

    Raises:
        AgentError: the paused run is another client's.
    """
    if resumed is not None and not holds(client, resumed.thread):
        raise AgentError("the request state names another client's run; call again without it")
    return resumed


def _refuse_if_down(memory_problem: str | None) -> None:
    """A run reads and writes its conversation: while the shared database is known down (its
    watch failed), fail at once with why, not after each query waited out the pool (~16 s)."""
    if memory_problem is not None:
        raise AgentError(memory_problem)


def _failure(record: dict[str, Any], message: str) -> RunOutcome:
    record["ended_at"] = now()
    record["error"] = message = error_text(message)
    return RunOutcome(record, error=f"ask_agent failed: {message}")


def _status(outcome: RunOutcome) -> RunStatus:
    return "failed" if outcome.error else "paused" if outcome.pending else "answered"


def _log_end(outcome: RunOutcome) -> None:
    record = outcome.record
    logger.info(
        "agent run %s %s: %d steps, %d tool calls, %d+%d tokens%s",
        record["run_id"],
        _status(outcome),
        record["steps"],
        len(record["tool_calls"]) + record["tool_calls_left_out"],
        record["usage"]["input_tokens"],
        record["usage"]["output_tokens"],
        f": {record['error']}" if record["error"] else "",
    )


def _let_go(exc: BaseException) -> None:
    """Clear the locals of ``exc``'s frames: its traceback sits in cycles only the collector's
    full pass frees, holding the failed run's whole conversation till then (grew the gateway
    by ~42 MB every 64 runs ended by the context bound, ``bench/README.md``)."""
    traceback.clear_frames(exc.__traceback__)
