"""The SDK session manager's sessions as room is made among them: how many it holds, which
are idle, which only listen, and ending one early.

The manager ends a session once no request of it has been in flight for its idle timeout:
its transport's ``idle_scope`` has that deadline while the session is idle, none (infinity)
while a request or its notification stream is open, and ending the session early is
cancelling it, as the timeout would (an open stream is closed with it). The manager's table of
transports is private (``_server_instances``), and so are a transport's count of requests in
flight, its stream included (``_requests_in_flight``), and its open streams
(``_request_streams``); ``tests/test_compat.py`` checks each, and ``idle_scope``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from mcp.server.streamable_http import GET_STREAM_KEY


def _transports(manager: object) -> dict[str, Any]:
    return getattr(manager, "_server_instances", {})


def held(manager: object) -> int:
    """How many sessions the manager holds, those being ended included (one lookup)."""
    return len(_transports(manager))


def live(manager: object) -> int:
    """How many sessions the manager holds that are not being ended (a pass over them)."""
    return sum(1 for transport in _transports(manager).values() if not _ending(transport))


def idle(manager: object, session_ids: Iterable[str]) -> dict[str, float]:
    """Which of ``session_ids`` are idle now (no request, no stream open), each with the time
    its idle timeout will end it at: the smallest, the session idle the longest."""
    transports = _transports(manager)
    found: dict[str, float] = {}
    for session_id in session_ids:
        scope = getattr(transports.get(session_id), "idle_scope", None)
        if scope is not None and not scope.cancel_called and scope.deadline < math.inf:
            found[session_id] = scope.deadline
    return found


def listening(manager: object, session_ids: Iterable[str]) -> list[str]:
    """Which of ``session_ids`` have their notification stream open and no request in flight."""
    return [
        session_id
        for session_id, transport in _live(manager, session_ids)
        if getattr(transport, "_requests_in_flight", 0) == 1
        and set(getattr(transport, "_request_streams", {})) == {GET_STREAM_KEY}
    ]


def serving(manager: object, session_ids: Iterable[str]) -> list[str]:
    """Which of ``session_ids`` the manager holds with a request in flight or a stream open
    (not idle, not being ended; one whose idle timer has not started yet counts as served)."""
    found: list[str] = []
    for session_id, transport in _live(manager, session_ids):
        scope = getattr(transport, "idle_scope", None)
        if scope is None or scope.deadline == math.inf:
            found.append(session_id)
    return found


def _live(manager: object, session_ids: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """Each of ``session_ids`` the manager holds and is not ending, with its transport."""
    transports = _transports(manager)
    for session_id in session_ids:
        transport = transports.get(session_id)
        if transport is not None and not _ending(transport):
            yield session_id, transport


def end(manager: object, session_id: str) -> bool:
    """End the session ``session_id`` now, as its idle timeout would have; whether this ended
    it (not: no such session, or one ending already)."""
    scope = getattr(_transports(manager).get(session_id), "idle_scope", None)
    if scope is None or scope.cancel_called:
        return False
    scope.cancel()
    return True


def _ending(transport: object) -> bool:
    scope = getattr(transport, "idle_scope", None)
    return scope is not None and scope.cancel_called
