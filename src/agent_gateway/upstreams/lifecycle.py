"""The one life of an upstream session, shared and dedicated alike: connect within
``connect_timeout``, attach the client, relay its resource updates, tell whether it still
answers, detach when it ends."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.session import MessageHandlerFnT
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_gateway.catalog_parts import Listing
from agent_gateway.compat.capabilities import told_per_request
from agent_gateway.compat.resumed import HttpSession
from agent_gateway.errors import UpstreamError, UpstreamRejected, UpstreamUnavailable, lone
from agent_gateway.upstreams.replies import Broadcast
from agent_gateway.upstreams.session import UpstreamSession
from agent_gateway.upstreams.transports import WritesEnded, open_transport, watched

T = TypeVar("T")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateSink:
    """Where a session's resource updates go, and who hears that the session ended."""

    updated: Callable[[UpstreamSession, str], Awaitable[None]]
    """Each ``notifications/resources/updated``: the session it came on, the upstream URI."""
    ended: Callable[[UpstreamSession], Awaitable[None]]
    """The session is over: its subscriptions are gone with it."""


ListingCallback = Callable[[str, Listing], Awaitable[None]]
DownCallback = Callable[[str], Awaitable[None]]
ChangeCallback = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Hooks:
    """What an upstream's shared connection tells the gateway: each listing, its log lines,
    its resource updates, that it went down (``failure_mode: hide``), that it said its lists
    changed (other replicas re-list it too)."""

    on_listing: ListingCallback
    broadcast: Broadcast | None = None
    updates: UpdateSink | None = None
    on_down: DownCallback | None = None
    on_changed: ChangeCallback | None = None


async def nothing(client: Client) -> None:
    """The default ``prepare``: nothing to do before the session is handed out."""
    return None


async def discovered(client: Client, protocol: str) -> None:
    """With the modern era pinned (``protocol: 2026-07-28``) the SDK sends nothing at connect
    and adopts a discover result it makes up, with no capabilities: nothing would be listed.
    The server's own is asked for once, as ``auto`` asks for it, and adopted instead."""
    if protocol not in MODERN_PROTOCOL_VERSIONS:
        return
    try:
        answer = await client.session.send_discover(protocol)
    except MCPError as exc:
        if exc.code != types.METHOD_NOT_FOUND:
            raise
        # As before: connected, listing nothing it did not say it has.
        logger.warning("upstream answers no server/discover (%s): its capabilities are unknown", exc)
        return
    client.session.adopt(types.DiscoverResult.model_validate(answer, by_name=False))


async def probe(client: Client) -> None:
    """One health check: ``ping`` in the handshake era; ``server/discover`` in the modern
    era, which has no ping (discover is side-effect free and answered by every server)."""
    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await client.session.send_discover(client.protocol_version)
    else:
        await client.session.send_request(types.PingRequest(), types.EmptyResult)


async def unanswered(client: Client, session: UpstreamSession) -> str | None:
    """Why ``session`` is gone, if one health check (within ``health.timeout``) says it is;
    None if the upstream answered it (an error answer is an answer too). Health checks
    bypass the guard: they must reach an upstream whose circuit is open, to see it recover."""
    timeout = session.config.health.timeout
    try:
        with anyio.fail_after(timeout), session.translated("ping"):
            await probe(client)
    except TimeoutError:
        return f"health check: no answer within {timeout:g}s"
    except UpstreamRejected:
        return None
    except UpstreamError as exc:
        return f"health check: {exc.detail}"
    return None


def _closed_for(session: UpstreamSession, exc: Exception) -> bool:
    """Whether ``exc`` is the connection closing because ``session`` was lost, for a reason it
    knows (``WritesEnded``: its message endpoint refused the handshake's POST): the SDK says
    only "Connection closed"."""
    closed = lone(exc)
    lost = session.lost_reason is not None
    return lost and isinstance(closed, MCPError) and closed.code == types.CONNECTION_CLOSED


@asynccontextmanager
async def connected(
    session: UpstreamSession,
    on_message: MessageHandlerFnT,
    updates: UpdateSink | None,
    prepare: Callable[[Client], Awaitable[T]] = nothing,  # type: ignore[assignment]
    link: HttpSession | None = None,
    resumed: types.InitializeResult | None = None,
) -> AsyncIterator[tuple[Client, TaskGroup, T]]:
    """``session`` connected: its client (after ``prepare``, which runs within the connect
    deadline too), a task group that ends with it, and what ``prepare`` returned. ``link``
    and ``resumed``: a Streamable HTTP session another replica opened, and its handshake.

    Raises:
        UpstreamUnavailable: the connection and ``prepare`` took longer than connect_timeout.
    """
    timeout = session.config.connect_timeout
    link = link or HttpSession()  # a Streamable HTTP transport puts its HTTP client there
    # One scope around the whole connection: a deadline while connecting, none after.
    # (A timeout scope around only the entry would exit before the client's task group.)
    with anyio.CancelScope(deadline=anyio.current_time() + timeout) as connecting:
        writes = WritesEnded(session.lose)
        opened = open_transport(session.config, link, session.id, writes)
        transport = watched(opened, session.lose, session.id, session.pace, writes)
        try:
            async with session.new_client(transport, on_message, resumed) as client:
                if resumed is None:
                    await discovered(client, session.config.protocol)
                told_per_request(client.session)  # its era adopted: its stamp is the era's
                prepared = await prepare(client)
                connecting.deadline = math.inf
                session.attach(client, link.client)
                async with anyio.create_task_group() as tg:
                    if updates is not None:  # running before anyone can subscribe
                        await tg.start(session.relay_updates, updates)
                    yield client, tg, prepared
                    tg.cancel_scope.cancel()
        except Exception as exc:  # translated, or raised as it is
            if connecting.deadline == math.inf or not _closed_for(session, exc):
                raise
            assert session.lost_reason is not None  # _closed_for says so
            raise UpstreamUnavailable(session.name, session.lost_reason) from exc
        finally:
            session.detach()
    if connecting.cancelled_caught:
        raise UpstreamUnavailable(session.name, f"no answer within connect_timeout ({timeout:g}s)")
