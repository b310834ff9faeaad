"""One upstream MCP server: open, list, watch, reconnect with backoff, close; and calls to it.

Its errors are translated where every call's are: ``UpstreamSession.translated``.
"""

from __future__ import annotations

import logging
import math
import time
from enum import StrEnum
from functools import partial

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_gateway.catalog_parts import (
    Listing,
    served_counts,
)
from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamUnavailable, describe
from agent_gateway.logs import scrubbed, shown_command
from agent_gateway.shown_urls import redacted_url
from agent_gateway.telemetry import health_failures, reconnects
from agent_gateway.upstreams.backoff import Backoff
from agent_gateway.upstreams.fetching import fetch_listing
from agent_gateway.upstreams.guard import Guard
from agent_gateway.upstreams.lifecycle import Hooks, connected, unanswered
from agent_gateway.upstreams.queueing import CallQueue
from agent_gateway.upstreams.session import UpstreamSession
from agent_gateway.upstreams.translation import cut_message, secrets_of

logger = logging.getLogger(__name__)

REFRESH_SPACING = 1.0
"""Seconds at least between two listings of one upstream after it says its lists changed. An
upstream sending ``list_changed`` flat out was listed again as fast as each listing ended (84
listings of 2,000 tools in 15 s, the gateway's CPU all theirs) and every client told each time."""
REFRESH_SHARE = 0.1
"""The most of the time one upstream's listings may take: after one that took ``t``, the next
waits ``t / REFRESH_SHARE - t``. One of 10,000 tools takes 0.7-1.6 s of the event loop: spaced
1 s, an upstream saying it changed after each took the loop 40 % of the time."""
REFRESH_SPACING_MAX = 30.0
"""The longest wait: ``took`` counts the upstream's own time too (a slow remote one's pages)."""


def refresh_spacing(took: float) -> float:
    """Seconds the next listing of an upstream waits after one that took ``took``."""
    return min(REFRESH_SPACING_MAX, max(REFRESH_SPACING, took / REFRESH_SHARE - took))


_LIST_CHANGED = (
    types.ToolListChangedNotification,
    types.PromptListChangedNotification,
    types.ResourceListChangedNotification,
)


class UpstreamState(StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"


class Upstream:
    """The life of one upstream's shared connection: connect, list, watch, reconnect."""

    def __init__(self, name: str, config: UpstreamConfig, hooks: Hooks) -> None:
        self.name, self.config = name, config
        self.guard = Guard(name, config)
        self.queue = CallQueue(name, config.max_concurrency, config.max_concurrency_per_client, self.guard)
        """Its clients' turns, on its shared session and its dedicated ones (``queueing.py``)."""
        self.state = UpstreamState.CONNECTING
        self.last_error: str | None = None
        self.up_since: float | None = None
        self.down_since: float | None = None
        self.connections = 0
        """Connections made so far (a restarted stdio upstream counts again)."""
        self.settled = anyio.Event()
        """Set once the first connection attempt has either succeeded or failed."""
        self.restarting = False  # by a configuration reload: calls wait for it (``ready``)
        self._hooks = hooks
        self._heard = False
        self._session: UpstreamSession | None = None
        self._refresh = anyio.Event()
        self._backoff = Backoff(config.retry.initial_delay, config.retry.max_delay)

    # -- life ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff until cancelled."""
        while True:
            was_up, began = False, time.monotonic()
            try:
                await self._connect_and_serve()
            except Exception as exc:  # top of this upstream's life: record, log, retry
                was_up = self._mark_down(exc)
            finally:
                self._session = None
                self.queue.reset()  # its window was judged from that session's pings
                self.settled.set()
            if was_up:
                self._backoff.held(time.monotonic() - began)
            if was_up and self._hooks.on_down is not None and self.config.failure_mode == "hide":
                await self._hooks.on_down(self.name)
            await anyio.sleep(self._backoff.next_delay())

    async def _connect_and_serve(self) -> None:
        self.state = UpstreamState.CONNECTING
        started = time.perf_counter()
        logger.info("starting %s (%s)", self.name, describe_target(self.config))
        session = UpstreamSession(
            self.name, self.config, broadcast=self._hooks.broadcast, guard=self.guard, queue=self.queue
        )
        fetch = partial(fetch_listing, upstream=self.name)
        async with connected(session, self._on_message, self._hooks.updates, fetch) as (
            client,
            tg,
            listing,
        ):
            self._session = session
            self._mark_up(client, listing, time.perf_counter() - started)
            await self._hooks.on_listing(self.name, listing)
            self.settled.set()
            await self._serve(client, session, tg)
        raise UpstreamUnavailable(self.name, session.lost_reason or "connection closed")

    async def _serve(self, client: Client, session: UpstreamSession, tg: TaskGroup) -> None:
        tg.start_soon(self._refresh_on_change, client, session)
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            tg.start_soon(self._listen_for_changes, client, session)
        # With no timer (health.interval null) a check is still sent when a call times out
        # with nothing else heard: one client's slow calls opened the circuit for every client.
        interval = self.config.health.interval
        tg.start_soon(self._ping, client, session, math.inf if interval is None else interval)
        if self.config.session == "shared" or self.config.kind != "stdio":  # see queueing.py
            tg.start_soon(self.queue.watch, partial(unanswered, client, session))
        await session.lost.wait()
        # Down at once: /readyz and new calls need not wait for the transport's close (a
        # WebSocket's closing handshake, a child's exit).
        self.state = UpstreamState.DOWN
        tg.cancel_scope.cancel()

    async def _ping(self, client: Client, session: UpstreamSession, interval: float) -> None:
        """Ping every ``interval`` (and when a call times out); an unanswered ping gives the
        connection up. Pings bypass
        the guard: they must reach an upstream whose circuit is open, to see it recover."""
        session.guard.checked = True
        try:
            await self._check(client, session, interval)
        finally:
            session.guard.checked = False

    async def _check(self, client: Client, session: UpstreamSession, interval: float) -> None:
        while True:
            await session.guard.check_due(interval)  # sooner when a call timed out
            if (reason := await unanswered(client, session)) is not None:
                health_failures.add(1, {"agent_gateway.upstream": self.name})
                session.lose(reason)
                return

    def _mark_up(self, client: Client, listing: Listing, took: float) -> None:
        if self.connections:
            reconnects.add(1, {"agent_gateway.upstream": self.name})
        self.connections += 1
        self.state = UpstreamState.UP
        self.up_since = time.time()
        self.down_since = None
        self.last_error = None
        # The breaker is not reset here: an upstream that dies on every call reconnects each
        # time, and only the breaker's memory across connections stops that loop.
        logger.info(
            "%s ready: %s in %.1f s (protocol %s)",
            self.name,
            served_counts(listing, self.config),
            took,
            client.protocol_version,
        )

    def _mark_down(self, exc: BaseException) -> bool:
        """Record the failure; True when the upstream had been up until now."""
        was_up = self.up_since is not None and self.down_since is None
        self.state = UpstreamState.DOWN
        # Cut first: an upstream refusing its handshake with 21 MB of message made every call
        # to its tools a 21 MB error, /status and the page 21 MB, /readyz 42 MB, while down.
        self.last_error = scrubbed(cut_message(describe(exc)), secrets_of(self.config))
        if was_up or self.down_since is None:
            self.down_since = time.time()
        logger.warning("upstream %s is down: %s", self.name, self.last_error)
        return was_up

    async def _on_message(self, message: IncomingMessage) -> None:
        # Runs on the dispatcher's read loop: never await session I/O here.
        if isinstance(message, _LIST_CHANGED):
            self._changed()

    def refresh(self) -> None:
        """List this upstream again (another replica heard it change)."""
        self._refresh.set()

    def _changed(self) -> None:
        self._heard = True
        self._refresh.set()

    async def _refresh_on_change(self, client: Client, session: UpstreamSession) -> None:
        """List the upstream again when it says its lists changed, at most once every
        ``REFRESH_SPACING`` (the notices meanwhile make one listing, after); one that does
        not list within ``connect_timeout`` is reconnected, as one that fails to."""
        while True:
            await self._refresh.wait()
            self._refresh = anyio.Event()
            heard, self._heard = self._heard, False
            started = time.monotonic()
            timeout = self.config.connect_timeout
            listing: Listing | None = None
            with anyio.move_on_after(timeout), session.translated("list"):
                listing = await fetch_listing(client, self.name)
            if listing is None:
                raise UpstreamUnavailable(
                    self.name, f"no listing within connect_timeout ({timeout:g}s) after a change"
                )
            await self._hooks.on_listing(self.name, listing)
            if heard and self._hooks.on_changed is not None:
                await self._hooks.on_changed(self.name)
            spacing = refresh_spacing(took := time.monotonic() - started)
            logger.info(
                "upstream %s changed its catalog; refreshed in %.2f s, the next in %.1f s at the soonest",
                self.name,
                took,
                spacing,
            )
            await anyio.sleep(spacing)

    async def _listen_for_changes(self, client: Client, session: UpstreamSession) -> None:
        caps = client.server_capabilities
        tools = bool(caps.tools and caps.tools.list_changed)
        prompts = bool(caps.prompts and caps.prompts.list_changed)
        resources = bool(caps.resources and caps.resources.list_changed)
        if not (tools or prompts or resources):
            return
        listen = client.listen(
            tools_list_changed=tools, prompts_list_changed=prompts, resources_list_changed=resources
        )
        try:
            async with listen as subscription:
                async for _event in subscription:
                    self._changed()
        except MCPError as exc:  # it announced list_changed but refuses the stream
            logger.warning("upstream %s refused subscriptions/listen: %s", self.name, exc.error.message)
            return
        # A modern upstream holds no connection but this stream: its end is the only sign,
        # short of a health check, that the server went away.
        session.lose("the upstream ended its change notification stream")

    # -- calls --------------------------------------------------------------------------

    def live_session(self) -> UpstreamSession | None:
        """The shared session if the upstream is connected now."""
        session = self._session
        return session if session is not None and session.client is not None else None

    async def ready(self) -> None:
        """Until a restarted upstream's first connection is made or fails, at most ``timeout``."""
        if self.restarting and not self.settled.is_set():
            with anyio.move_on_after(self.config.timeout):
                await self.settled.wait()

    def session(self) -> UpstreamSession:
        """The shared session calls go over.

        Raises:
            UpstreamUnavailable: the upstream is not connected now.
        """
        session = self._session
        if session is None or session.client is None or self.state != UpstreamState.UP:
            if self.restarting and not self.settled.is_set():
                raise UpstreamUnavailable(self.name, "restarting after a configuration reload")
            reason = f": {self.last_error}" if self.last_error else ""
            raise UpstreamUnavailable(self.name, f"not connected ({self.state}{reason})")
        return session


def describe_target(config: UpstreamConfig, width: int = 80) -> str:
    """What an upstream is, for a log line: its command line (cut), or its URL without
    credentials or query (either may hold secrets)."""
    if config.url is None:
        line = shown_command(config.command or "", config.args)
        return line if len(line) <= width else f"{line[: width - 1]}…"
    return redacted_url(config.url)
