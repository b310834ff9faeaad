"""One upstream MCP server: open, list, watch, reconnect with backoff, close; and calls to it.

This module is the one boundary where the ``mcp`` client's errors (``MCPError``, transport
and validation errors) are translated into the gateway's tree (``UpstreamError``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamUnavailable
from agent_gateway.telemetry import reconnects
from agent_gateway.upstreams.session import Broadcast, UpdateSink, UpstreamSession, describe
from agent_gateway.upstreams.transports import open_transport, watched

logger = logging.getLogger(__name__)

_PAGE_CAP = 1000
_LIST_CHANGED = (
    types.ToolListChangedNotification,
    types.PromptListChangedNotification,
    types.ResourceListChangedNotification,
)

T = TypeVar("T")


class UpstreamState(StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class Listing:
    """Everything an upstream offers, as it last told us."""

    tools: tuple[types.Tool, ...] = ()
    prompts: tuple[types.Prompt, ...] = ()
    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    instructions: str | None = None
    protocol_version: str = ""


ListingCallback = Callable[[str, Listing], Awaitable[None]]


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter, reset after a good connection."""

    initial: float = 0.5
    maximum: float = 30.0
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2**self.attempt)
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class Upstream:
    """The life of one upstream's shared connection: connect, list, watch, reconnect."""

    def __init__(
        self,
        name: str,
        config: UpstreamConfig,
        on_listing: ListingCallback,
        broadcast: Broadcast | None = None,
        updates: UpdateSink | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.state = UpstreamState.CONNECTING
        self.last_error: str | None = None
        self.up_since: float | None = None
        self.down_since: float | None = None
        self.settled = anyio.Event()
        """Set once the first connection attempt has either succeeded or failed."""
        self._on_listing = on_listing
        self._broadcast = broadcast
        self._updates = updates
        self._session: UpstreamSession | None = None
        self._refresh = anyio.Event()
        self._backoff = Backoff()

    # -- life ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff until cancelled."""
        while True:
            try:
                await self._connect_and_serve()
            except Exception as exc:  # top of this upstream's life: record, log, retry
                self._mark_down(exc)
            finally:
                self._session = None
                self.settled.set()
            await anyio.sleep(self._backoff.next_delay())

    async def _connect_and_serve(self) -> None:
        self.state = UpstreamState.CONNECTING
        session = UpstreamSession(self.name, self.config, broadcast=self._broadcast)
        # One scope around the whole connection: a deadline while connecting, none after.
        # (A timeout scope around only the entry would exit before the client's task group.)
        with anyio.CancelScope(deadline=anyio.current_time() + self.config.connect_timeout) as connecting:
            transport = watched(open_transport(self.config), session.lost)
            try:
                async with session.new_client(transport, self._on_message) as client:
                    listing = await fetch_listing(client)
                    connecting.deadline = math.inf
                    session.attach(client)
                    async with anyio.create_task_group() as tg:
                        if self._updates is not None:  # running before anyone can subscribe
                            await tg.start(session.relay_updates, self._updates)
                        self._session = session
                        self._mark_up(client)
                        await self._on_listing(self.name, listing)
                        self.settled.set()
                        await self._serve(client, session, tg)
            finally:
                session.detach()
        if connecting.cancelled_caught:
            raise UpstreamUnavailable(
                self.name, f"no answer within connect_timeout ({self.config.connect_timeout:g}s)"
            )
        raise UpstreamUnavailable(self.name, "connection closed")

    async def _serve(self, client: Client, session: UpstreamSession, tg: TaskGroup) -> None:
        tg.start_soon(self._refresh_on_change, client, session)
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            tg.start_soon(self._listen_for_changes, client)
        await session.lost.wait()
        tg.cancel_scope.cancel()

    def _mark_up(self, client: Client) -> None:
        if self.down_since is not None and self.up_since is not None:  # it had been up before
            reconnects.add(1, {"agent_gateway.upstream": self.name})
        self.state = UpstreamState.UP
        self.up_since = time.time()
        self.down_since = None
        self.last_error = None
        self._backoff.reset()
        logger.info("upstream %s connected (protocol %s)", self.name, client.protocol_version)

    def _mark_down(self, exc: BaseException) -> None:
        was_up = self.state == UpstreamState.UP
        self.state = UpstreamState.DOWN
        self.last_error = describe(exc)
        if was_up or self.down_since is None:
            self.down_since = time.time()
        logger.warning("upstream %s is down: %s", self.name, self.last_error)

    async def _on_message(self, message: IncomingMessage) -> None:
        # Runs on the dispatcher's read loop: never await session I/O here.
        if isinstance(message, _LIST_CHANGED):
            self._refresh.set()

    async def _refresh_on_change(self, client: Client, session: UpstreamSession) -> None:
        while True:
            await self._refresh.wait()
            self._refresh = anyio.Event()
            with session.translated("list"):
                listing = await fetch_listing(client)
            logger.info("upstream %s changed its catalog; refreshed", self.name)
            await self._on_listing(self.name, listing)

    async def _listen_for_changes(self, client: Client) -> None:
        caps = client.server_capabilities
        tools = bool(caps.tools and caps.tools.list_changed)
        prompts = bool(caps.prompts and caps.prompts.list_changed)
        resources = bool(caps.resources and caps.resources.list_changed)
        if not (tools or prompts or resources):
            return
        listen = client.listen(
            tools_list_changed=tools, prompts_list_changed=prompts, resources_list_changed=resources
        )
        async with listen as subscription:
            async for _event in subscription:
                self._refresh.set()

    # -- calls --------------------------------------------------------------------------

    def live_session(self) -> UpstreamSession | None:
        """The shared session if the upstream is connected now."""
        session = self._session
        return session if session is not None and session.client is not None else None

    def session(self) -> UpstreamSession:
        """The shared session calls go over.

        Raises:
            UpstreamUnavailable: the upstream is not connected now.
        """
        session = self._session
        if session is None or session.client is None or self.state != UpstreamState.UP:
            reason = f": {self.last_error}" if self.last_error else ""
            raise UpstreamUnavailable(self.name, f"not connected ({self.state}{reason})")
        return session


async def fetch_listing(client: Client) -> Listing:
    """Everything the upstream lists, all pages, for what its capabilities say it has."""
    caps = client.server_capabilities
    return Listing(
        tools=await _all_pages(client.list_tools, lambda r: r.tools) if caps.tools else (),
        prompts=await _all_pages(client.list_prompts, lambda r: r.prompts) if caps.prompts else (),
        resources=await _all_pages(client.list_resources, lambda r: r.resources) if caps.resources else (),
        templates=(
            await _all_pages(client.list_resource_templates, lambda r: r.resource_templates)
            if caps.resources
            else ()
        ),
        instructions=client.instructions,
        protocol_version=client.protocol_version,
    )


async def _all_pages(fetch: Callable[..., Awaitable[Any]], items: Callable[[Any], list[T]]) -> tuple[T, ...]:
    collected: list[T] = []
    cursor: str | None = None
    for _ in range(_PAGE_CAP):
        page = await fetch(cursor=cursor)
        collected.extend(items(page))
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(collected)
