"""Which of a client's sessions has been idle the longest, ended to make room for its next.

The SDK's session manager ends a session once no request of it has been in flight for its
idle timeout: its transport's ``idle_scope`` has that deadline while the session is idle, none
(infinity) while a request or its notification stream is open, and ending the session early
is cancelling it, as the timeout would. The manager's table of transports is private
(``_server_instances``); ``tests/test_compat.py`` checks it and ``idle_scope``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def end_longest_idle(manager: object, session_ids: Iterable[str]) -> str | None:
    """End (as its idle timeout would) the session among ``session_ids`` idle the longest;
    its id, or None when none is idle (each has a request or its stream open)."""
    transports: dict[str, Any] = getattr(manager, "_server_instances", {})
    idle = [
        (scope.deadline, session_id, scope)
        for session_id in session_ids
        if (scope := getattr(transports.get(session_id), "idle_scope", None)) is not None
        and not scope.cancel_called
        and scope.deadline < math.inf
    ]
    if not idle:
        return None
    _, session_id, scope = min(idle, key=lambda entry: entry[0])
    scope.cancel()
    return session_id
