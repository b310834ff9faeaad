"""What changed, told to handshake-era sessions on their notification streams: resource
updates and list changes.

Each session's notices are sent in order by a task of its own, at most ``QUEUED`` resource
updates waiting; more are dropped for a session that far behind (counted as
``notifications.dropped{kind=resource_updated,why=behind}``). A list change waiting is not
queued again: one notice tells the client to list again. Before, one task per upstream
session relayed its updates to each subscriber in turn, each send allowed ``SEND_TIMEOUT``:
a client that did not read its notification stream, once the stream was full, held every
update of that upstream session 5 s, for every client subscribed through it, and those
behind were dropped (a bystander's update never came in 60 s; 0.02 s alone). And a catalog
change told every session its lists changed in turn, 2 s allowed each: ten such sessions of
one client held a bystander's ``tools/list_changed`` 20 s (0.13 s alone), and the catalog's
listeners with it. An update only says "read it again": a client that far behind loses
nothing it could not read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import anyio
from mcp.server.connection import Connection

from agent_gateway.catalog import ListName
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.runtime import SEND_TIMEOUT, TaskHost
from agent_gateway.tally import notifications_dropped

QUEUED = 64
"""Resource updates waiting for one session at most (each a URI: 8 KiB at most, so 512 KiB)."""
LIST_SENDERS: dict[ListName, Callable[[Connection], Awaitable[None]]] = {
    "tools": lambda c: c.send_tool_list_changed(),
    "prompts": lambda c: c.send_prompt_list_changed(),
    "resources": lambda c: c.send_resource_list_changed(),
}


@dataclass(eq=False)
class _Waiting:
    uris: deque[str] = field(default_factory=deque[str])
    """Public URIs of resource updates, in order."""
    lists: set[ListName] = field(default_factory=set[ListName])
    """Lists changed since the session was last told (sent first: there are three at most)."""


class UpdateSends(TaskHost):
    """Sends resource updates and list changes to handshake-era sessions, from a task per
    session with notices to send (run it while the gateway serves)."""

    def __init__(self) -> None:
        self._waiting: dict[DownstreamSession, _Waiting] = {}
        """What waits for each session that has anything waiting (its task sends it)."""

    def send(self, session: DownstreamSession, uri: str) -> None:
        """Queue ``uri``'s update for ``session``; returns at once."""
        if (waiting := self._of(session)) is None:
            return  # stopping
        if len(waiting.uris) >= QUEUED:
            notifications_dropped.add(1, {"kind": "resource_updated", "why": "behind"})
            return
        waiting.uris.append(uri)

    def lists_changed(self, session: DownstreamSession, lists: Iterable[ListName]) -> None:
        """Queue ``list_changed`` for each of ``lists`` for ``session``; returns at once."""
        if (waiting := self._of(session)) is not None:
            waiting.lists.update(lists)

    def _of(self, session: DownstreamSession) -> _Waiting | None:
        """What waits for ``session``, its task started if none was (None: stopping)."""
        if (waiting := self._waiting.get(session)) is None:
            waiting = _Waiting()
            if not self.start_soon(self._drain, session, waiting, name="notices to a client"):
                return None
            self._waiting[session] = waiting
        return waiting

    async def _drain(self, session: DownstreamSession, waiting: _Waiting) -> None:
        try:
            while waiting.lists or waiting.uris:
                if waiting.lists:
                    kind = min(waiting.lists)
                    waiting.lists.discard(kind)  # one changed from now is told again
                    await _told(session, LIST_SENDERS[kind])
                else:
                    await _told(session, lambda c, uri=waiting.uris[0]: c.send_resource_updated(uri))
                    waiting.uris.popleft()
        finally:
            self._waiting.pop(session, None)


async def _told(session: DownstreamSession, send: Callable[[Connection], Awaitable[None]]) -> None:
    if (connection := session.connection) is not None:
        with anyio.move_on_after(SEND_TIMEOUT):
            await send(connection)
