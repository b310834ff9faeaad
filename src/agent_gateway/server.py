"""Assembling the gateway from configuration: upstream pool, catalog, proxy, FastMCP server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from fastmcp import FastMCP
from mcp.server.request_state import RequestStateSecurity

from agent_gateway import __version__, access, runtime
from agent_gateway.access import AccessControl, Principal
from agent_gateway.activity import Activity
from agent_gateway.agent.tool import INPUT_SCHEMA, RUNNER_MODULE, AgentTool
from agent_gateway.audit import AuditLog
from agent_gateway.authentication import build_auth
from agent_gateway.call_records import CallRecorder
from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.catalog_parts import Listing
from agent_gateway.compat.exchange import PARAMS_SENT
from agent_gateway.compat.fastmcp import lowlevel_server, past_fastmcp
from agent_gateway.compat.mcp import connection_of
from agent_gateway.components import CatalogProvider
from agent_gateway.config import GatewayConfig, ServerConfig
from agent_gateway.downstream.broadcast import LogBroadcast
from agent_gateway.downstream.level_changes import LevelChanges
from agent_gateway.downstream.notifier import ListChangedNotifier
from agent_gateway.downstream.records import HeldRecords
from agent_gateway.downstream.sessions import STATE_KEY, DownstreamSession, SessionRegistry
from agent_gateway.downstream.subscriptions import ResourceSubscriptions
from agent_gateway.errors import ConfigError, UnknownName
from agent_gateway.in_flight import bounded
from agent_gateway.listing import ToolListing
from agent_gateway.listing_components import ComponentLists
from agent_gateway.naming import own_tool_names
from agent_gateway.pins import pins_for
from agent_gateway.pipeline import Pipeline
from agent_gateway.proxy import Proxy
from agent_gateway.request_wrapper import RequestWrapper
from agent_gateway.search.engine import ToolSearch
from agent_gateway.search.tools import CALL_TOOL, SEARCH_TOOLS, call_tool, search_tool
from agent_gateway.store import shared_state
from agent_gateway.telemetry import RequestTelemetry, watch_upstreams
from agent_gateway.upstreams import UpstreamPool
from agent_gateway.upstreams.dedicated import DedicatedSessions
from agent_gateway.upstreams.lifecycle import Hooks, UpdateSink
from agent_gateway.upstreams.session import UpstreamSession
from agent_gateway.visibility import Visibility

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from agent_gateway.agent.runner import AgentRunner

logger = logging.getLogger(__name__)


class Gateway:
    """Everything one running gateway owns. Use ``async with gateway.running():``."""

    def __init__(self, config: GatewayConfig, *, chat_model: BaseChatModel | None = None) -> None:
        """``chat_model`` replaces the configured ``agent.model`` (tests, embedding)."""
        self.config = config
        self.activity = Activity()
        """The last calls and agent runs: the access log line, the status page, the audit log."""
        self.audit = AuditLog(config.audit) if config.audit.enabled else None
        if self.audit is not None:
            self.activity.subscribe(self.audit.record)
        self.pins = pins_for(config)
        self.catalog = Catalog(config, reserved=own_tool_names(config), review=self.pins.review)
        self.visibility = Visibility(self.catalog, config.server.instructions)
        self.shared = shared_state(config)
        """What the replicas share (None: one replica, everything in this process)."""
        self.sessions = SessionRegistry(
            on_end=self._session_ended,
            holds=lambda session: self.subscriptions.holds(session) or self.proxy.holds_dedicated(session),
            on_levels=lambda session: self.level_changes.changed(session),
            records=self.shared.sessions if self.shared is not None else None,
        )
        self._updates = UpdateSink(self._resource_updated, self._upstream_ended)
        self.broadcast = LogBroadcast(self.sessions.handshake_sessions, self.visibility.may_see)
        changed = self.shared.catalog_changed if self.shared is not None else None
        hooks = Hooks(
            self._upstream_listed, self.broadcast.send, self._updates, self.catalog.withdraw, changed
        )
        self.pool = UpstreamPool(config.active_upstreams, hooks)
        if self.shared is not None:
            self.shared.on_catalog_changed(self._refresh_upstream)
        self.dedicated = DedicatedSessions(
            config.active_upstreams,
            self._updates,
            self.pool.upstreams,
            records=self.shared.sessions if self.shared is not None else None,
            idle_timeout=config.server.session_idle_timeout,
        )
        self.proxy = Proxy(self.catalog, self.pool, self.dedicated)
        self.level_changes = LevelChanges(self.proxy.apply_log_levels, self.sessions.handshake_sessions)
        self.rounds = self.shared.rounds(self.proxy.held) if self.shared is not None else None
        self.search = ToolSearch(config.search.embeddings)
        self.listing = ToolListing(self.catalog, config.search, config.server.page_size, self._own_tools)
        self.notifier = ListChangedNotifier(
            self.sessions.handshake_sessions,
            lambda: self.subscriptions.streams(),
            self.listing.changed_for,
            lambda session, lists: self.subscriptions.sends.lists_changed(session, lists),
        )
        holders = self.shared.holders if self.shared is not None else None
        self.subscriptions = ResourceSubscriptions(
            self.proxy, self.notifier.bus, holders, config.server.max_listen_streams
        )
        if (shared := self.shared) is not None:
            subscribed, dedicated = self.subscriptions.held, self.dedicated.records_of
            shared.keeper.keep(HeldRecords(self.sessions, dedicated, subscribed, shared.replica))
            shared.on_level_set(self.level_changes.hears(self.sessions.level_set_elsewhere))
            shared.holders.on_dropped(self.subscriptions.dropped_elsewhere)
            shared.events.client_of = lambda sid: s.label if (s := self.sessions.live.get(sid)) else None
        # In this order: searches and listings reflect a change before any client is told of it.
        self.catalog.subscribe_early(self.search.prepare)
        self.catalog.subscribe(self.search.changed)
        self.catalog.subscribe(self.notifier.notify)
        self.catalog.subscribe(self.listing.changed)
        catalog_listing = CatalogProvider(self.catalog)
        self.agent: AgentRunner | None = None  # built by running()
        self._chat_model = chat_model
        self._agent_tool = AgentTool(config.agent) if config.agent.enabled else None
        self.server = FastMCP(
            config.server.name,
            version=__version__,  # serverInfo names the gateway, not the FastMCP it is built on
            instructions=config.server.instructions,
            providers=[catalog_listing],
            middleware=[self.sessions],
            request_state_security=_state_security(config.server),
            auth=build_auth(config.auth),  # HTTP only: stdio clients are local processes
            # Upstream schemas pass through as written ($defs and $ref kept), not inlined.
            dereference_schemas=False,
            list_page_size=config.server.page_size,
        )
        self.access = AccessControl(config.auth)
        watch_upstreams(self.pool)
        lowlevel = lowlevel_server(self.server)
        # First in the chain, the only middleware: client, span and record, once per request.
        own = set(own_tool_names(config))
        kept = config.audit.arguments if config.audit.enabled else "none"
        unaudited = self._unaudited if config.audit.required else None
        self._recorder = CallRecorder(self.activity, kept, unaudited, self.pool.secrets)
        telemetry = RequestTelemetry(lambda: own)
        wrapper = RequestWrapper(
            self.access, telemetry, self._recorder, self.visibility, self._upstream_of, CALL_TOOL
        )
        lowlevel.middleware.insert(0, wrapper)
        self.drain = wrapper.drain  # cut by a stop's drain (serving.py) once its time is up
        searching = config.search.mode != "off"
        self.pipeline = Pipeline(
            self.access,
            self.catalog,
            self.proxy,
            self.sessions,
            self._agent_tool,
            self.search if searching else None,
            config.search,
            own_tool_names(config),
            catalog_listing.public_uri,
        )
        # The forwarded methods, served on one path (pipeline.py) instead of FastMCP's.
        lowlevel.add_request_handler("tools/call", types.CallToolRequestParams, self.pipeline.call_tool)
        lowlevel.add_request_handler("prompts/get", types.GetPromptRequestParams, self.pipeline.get_prompt)
        lowlevel.add_request_handler(
            "resources/read", types.ReadResourceRequestParams, self.pipeline.read_resource
        )
        lowlevel.add_request_handler(
            "completion/complete", types.CompleteRequestParams, self.pipeline.complete
        )
        lowlevel.add_request_handler("tools/list", types.PaginatedRequestParams, self.listing)
        ComponentLists(self.server, self.catalog, self.sessions, config.server.page_size).register(lowlevel)
        past_fastmcp(lowlevel, SERVED_HERE | ComponentLists.METHODS)
        # FastMCP serves neither; modern clients learn of catalog changes on subscriptions/listen.
        lowlevel.add_request_handler(
            "subscriptions/listen", types.SubscriptionsListenRequestParams, self.subscriptions.listen
        )
        lowlevel.add_request_handler(
            "resources/subscribe", types.SubscribeRequestParams, self.subscriptions.subscribe
        )
        lowlevel.add_request_handler(
            "resources/unsubscribe", types.UnsubscribeRequestParams, self.subscriptions.unsubscribe
        )
        lowlevel.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
        )
        # Modern tools/call checks Mcp-Param-* headers by this (else each ran tools/list: a third of its CPU).
        lowlevel.get_tool_input_schema = self._input_schema

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        """A tool's inputSchema by public name (the catalog's or ``ask_agent``'s), or None:
        None too for a tool the admitted client may not call, or with no client admitted
        (the headers then go unchecked; the call itself is refused on its own path), or for
        one it is not listed (search mode) when it sent no header: it could not know them."""
        client = access.admitted()
        if client is None or not client.allows("tool", name):
            return None
        if (origin := (snapshot := self.catalog.snapshot).tools.get(name)) is not None:  # None: no header
            known = snapshot.declares_headers(name) and (
                PARAMS_SENT.get() or self.listing.lists(client, name)
            )
            return origin.item.input_schema if known else None
        if self._agent_tool is not None and name == self._agent_tool.name:
            return INPUT_SCHEMA
        if self.config.search.mode != "off" and name in (SEARCH_TOOLS, CALL_TOOL):
            tool = search_tool(self.config.search.limit) if name == SEARCH_TOOLS else call_tool()
            return tool.input_schema
        return None

    def _own_tools(
        self, snapshot: CatalogSnapshot, client: Principal | None, searching: bool
    ) -> list[types.Tool]:
        """The gateway's own tools ``client`` is listed: ``ask_agent`` under its policy, and the
        search tools when it is in search mode."""
        tools: list[types.Tool] = []
        agent = self._agent_tool
        if agent is not None and (client is None or client.allows("tool", agent.name)):
            tools.append(agent.definition(snapshot, self.visibility.upstreams(client, snapshot)))
        if searching:
            tools += [search_tool(self.config.search.limit), call_tool()]
        return tools

    def _upstream_of(self, method: str, target: str) -> str | None:
        """The upstream a request for ``target`` goes to (for its span and metrics), or None."""
        snapshot = self.catalog.snapshot
        try:
            if method == "tools/call":
                return snapshot.tool(target).upstream if target in snapshot.tools else None
            if method == "prompts/get":
                return snapshot.prompt(target).upstream if target in snapshot.prompts else None
            return snapshot.resource(target)[0] if method.startswith("resources/") else None
        except UnknownName:
            return None

    @asynccontextmanager
    async def running(self, *, settle_timeout: float | None = None) -> AsyncIterator[Gateway]:
        """Connect the upstreams (waiting ``settle_timeout`` or ``server.startup_wait``), build
        the catalog; stop everything on exit.

        Raises:
            ConfigError: two upstreams produce the same public name at start-up, or the agent's
                model provider refuses its configured settings.
        """
        refused: ConfigError | None = None
        settle_timeout = self.config.server.startup_wait if settle_timeout is None else settle_timeout
        try:
            async with (
                bounded(self.config.server.max_bytes_in_flight),
                self.shared.running() if self.shared is not None else nullcontext(),
                self.pins.running(self._refresh_upstream),  # loaded before any listing is reviewed
                # The agent's libraries are imported while the upstreams connect.
                runtime.importing(RUNNER_MODULE if self._agent_tool is not None else None) as agent_imported,
                self.search.running(),  # indexes each upstream's tools as it connects
                self.pool.running(settle_timeout=settle_timeout),
                self.dedicated.running(),
                self.proxy.held.running(),
                self.broadcast.running(),
                self.subscriptions.running(),
                self.level_changes.running(),
                self._agent_running(agent_imported) as agent_refused,
                self.audit.running() if self.audit is not None else nullcontext(),
            ):
                try:
                    if agent_refused is not None:
                        raise agent_refused
                    snapshot = self.catalog.start()
                except ConfigError as exc:
                    refused = exc  # raised below, once the pool is closed, not inside its task group
                else:
                    await self.search.load(snapshot)
                    self.server.instructions = _instructions(self.config.server.instructions, snapshot)
                    snapshot.log_ready(len(self.pool.upstreams))
                    try:
                        yield self
                    finally:
                        self.subscriptions.close_streams()
        finally:
            self.pins.close()  # the upstreams are closed: no listing can come to review
        if refused is not None:
            raise refused

    @asynccontextmanager
    async def _agent_running(self, imported: anyio.Event) -> AsyncIterator[ConfigError | None]:
        """The agent built and running; or, yielded, why its model provider refuses its
        settings (``running`` raises it once everything has stopped)."""
        if (tool := self._agent_tool) is None:
            yield None
            return
        # With the memory shared, a conversation's runs take turns across replicas too.
        shared = self.shared if self.config.agent.memory.store == "postgres" else None
        exclusive, vacant = (shared.leases.held, shared.leases.vacant) if shared is not None else (None, None)
        parts = (self.config.agent, self.catalog, self.proxy, self._chat_model, self.search, self.activity)
        try:
            runner = (await tool.runner_class(imported))(
                *parts, exclusive=exclusive, vacant=vacant, recorder=self._recorder
            )
        except ConfigError as exc:
            yield exc
            return
        try:
            async with tool.serving(runner):
                self.agent = runner
                yield None
        finally:
            self.agent = None

    def _refresh_upstream(self, name: str) -> None:
        """List ``name`` again: another replica heard it change, or its last review could
        not be written (``pins.running``)."""
        if (upstream := self.pool.upstreams.get(name)) is not None:
            upstream.refresh()

    def _unaudited(self) -> str | None:
        return None if self.audit is None else self.audit.outage.problem

    def unready(self) -> list[str]:
        """Why this replica should take no new traffic (empty: it may)."""
        problems = [
            self.shared.problem if self.shared is not None else None,
            self.agent.memory_problem if self.agent is not None else None,
            self._unaudited() if self.config.audit.required else None,
        ]
        return [p for p in problems if p is not None]

    async def _session_ended(self, session: DownstreamSession) -> None:
        await self.subscriptions.session_ended(session)
        await self.proxy.end_session(session)

    async def _roots_changed(self, ctx: Any, params: types.NotificationParams) -> None:
        if isinstance(session := connection_of(ctx.session).state.get(STATE_KEY), DownstreamSession):
            await self.proxy.roots_changed(session)

    async def take_over_subscriptions(self, session_id: str) -> None:
        """This replica holds ``session_id``'s notification stream: it takes over the
        session's subscriptions no replica holds (their holder died, or let them go)."""
        if (session := self.sessions.live.get(session_id)) is not None:
            await self.subscriptions.take_over(session)

    async def _resource_updated(self, upstream: UpstreamSession, uri: str) -> None:
        await self.subscriptions.updated(upstream, uri)

    async def _upstream_ended(self, upstream: UpstreamSession) -> None:
        await self.subscriptions.upstream_ended(upstream)

    async def _upstream_listed(self, upstream: str, listing: Listing) -> None:
        await self.catalog.update(upstream, listing)
        # A reconnected session is at the upstream's own default level.
        await self.proxy.apply_log_levels(None, self.sessions.handshake_sessions(), upstream)

    def status(self) -> dict[str, object]:
        """Live counts for ``/status``: what tests and operators check for leaks."""
        return {
            "sessions": {
                "live": len(self.sessions.live),
                "opened": self.sessions.opened,
                "ended": self.sessions.ended,
                "adopted": self.sessions.adopted,
            },
            "calls": self.activity.count,
            "store": None if self.shared is None else (self.shared.problem or "available"),
            "audit": None if self.audit is None else (self.audit.outage.problem or "writing"),
            "upstream_sessions": {
                "shared": len(self.pool.live_sessions()),
                "dedicated": len(self.dedicated.live),
                "dedicated_opened": self.dedicated.opened,
            },
            "pending_calls": self.proxy.pending(),
            "subscriptions": self.subscriptions.count,
            "tasks": len(asyncio.all_tasks()),
            "child_processes": len(runtime.child_pids()),
            "runtime": runtime.describe(),
            "upstreams": [s.as_dict() for s in self.pool.statuses(self.catalog.problems)],
        }


SERVED_HERE = frozenset({"tools/call", "prompts/get", "resources/read", "completion/complete", "tools/list"})
"""The methods the gateway's own handlers serve (the pipeline's, the listing's): FastMCP's
root middleware, which binds a request context for FastMCP's handlers, is skipped for them."""


def _instructions(own: str | None, snapshot: CatalogSnapshot) -> str | None:
    parts = [own] if own else []
    parts += [f"[{name}] {text}" for name, text in snapshot.instructions.items()]
    return "\n\n".join(parts) or None


def _state_security(config: ServerConfig) -> RequestStateSecurity | None:
    """The configured keys for sealing ``requestState``, or None for FastMCP's per-process key."""
    if not config.state_keys:
        return None
    return RequestStateSecurity(keys=list(config.state_keys), audience=config.name)
