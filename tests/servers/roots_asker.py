"""A stdio upstream that re-reads its client's roots whenever told they changed, as
server-everything does; it appends one line per roots/list it sends (and per answer)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

LOG = os.environ.get("ROOTS_LOG") or sys.argv[1]


def _note(what: str) -> None:
    with open(LOG, "a") as out:
        out.write(what + "\n")


class ReReadRoots(Middleware):
    async def on_notification(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        if context.method == "notifications/roots/list_changed" and context.fastmcp_context is not None:
            # In a task of its own: a server re-reading its roots goes on serving meanwhile.
            task = asyncio.create_task(_reread(context.fastmcp_context.session))
            _TASKS.add(task)
            task.add_done_callback(_TASKS.discard)
        return await call_next(context)


_TASKS: set[asyncio.Task[None]] = set()


async def _reread(session: Any) -> None:
    _note("asked")
    try:
        await session.list_roots()
        _note("answered")
    except Exception as exc:  # an error answer: it was answered
        _note(f"answered-error {type(exc).__name__} {exc}")


server = FastMCP("roots", middleware=[ReReadRoots()])


@server.tool
def noop() -> str:
    """Does nothing."""
    return "ok"


if __name__ == "__main__":
    server.run(show_banner=False, log_level="WARNING")
