"""Telling connected clients that the catalog changed, in both protocol eras.

Handshake-era sessions get ``notifications/*/list_changed`` on their connection; modern
(2026-07-28) clients get the same events on their ``subscriptions/listen`` streams. A client
is told the tool list changed only when what it is listed changed (its policy's tools, or in
search mode its pinned ones): a client in search mode over a thousand tools is not told of
every one of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ServerEvent,
    ToolsListChanged,
)

from agent_gateway.access import Principal
from agent_gateway.catalog import CatalogChange, ListName
from agent_gateway.downstream.sessions import DownstreamSession

logger = logging.getLogger(__name__)

_EVENTS: dict[ListName, ServerEvent] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}
ChangedFor = Callable[[CatalogChange, Principal | None], bool]
"""Whether a change altered the tools a client is listed."""
Tell = Callable[[DownstreamSession, Iterable[ListName]], None]
"""Queues a handshake-era session's list changes (``update_sends.UpdateSends``): never waits on
its client. Told one after another, each allowed 2 s, ten sessions of one client that did not
read their streams held a bystander's ``tools/list_changed`` 20 s, and the catalog with it."""


class ListChangedNotifier:
    """Fans catalog changes out to the clients they concern, in both eras."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[DownstreamSession]],
        streams: Callable[[], Mapping[DownstreamSession, InMemorySubscriptionBus]],
        changed_for: ChangedFor,
        tell: Tell,
    ) -> None:
        """``sessions()``: the handshake-era sessions; ``streams()``: each modern client's
        listen stream; ``changed_for``: whether a change altered a client's tool list;
        ``tell``: how a handshake-era session is told its lists changed."""
        self._sessions = sessions
        self._streams = streams
        self._changed_for = changed_for
        self._tell = tell
        self.bus = InMemorySubscriptionBus()
        """Prompt and resource list changes for every modern listen stream."""

    async def notify(self, change: CatalogChange) -> None:
        """Send each client one list_changed per kind of list that changed for it."""
        shared: list[ListName] = sorted(change.lists - {"tools"})
        for kind in shared:
            await self.bus.publish(_EVENTS[kind])
        told: dict[str | None, bool] = {}

        def tools_changed(session: DownstreamSession) -> bool:
            key = session.client.policy_key if session.client is not None else None
            if key not in told:
                told[key] = "tools" in change.lists and self._changed_for(change, session.client)
            return told[key]

        for session, stream in list(self._streams().items()):
            if tools_changed(session):
                await stream.publish(_EVENTS["tools"])
        for session in list(self._sessions()):
            lists: list[ListName] = [*shared, "tools"] if tools_changed(session) else shared
            if session.connection is not None and lists:
                self._tell(session, lists)

    async def policies_changed(self, clients: set[Principal]) -> None:
        """Tell ``clients`` (a reload changed their policies) that each of their lists may have
        changed: what their policy lets them see is not compared, a reload being rare."""
        for session, stream in list(self._streams().items()):
            if session.client in clients:
                for event in _EVENTS.values():
                    await stream.publish(event)
        for session in list(self._sessions()):
            if session.client in clients and session.connection is not None:
                self._tell(session, _EVENTS)
