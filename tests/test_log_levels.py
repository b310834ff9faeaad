"""A shared upstream session's log level when its sends fail or are given up on
(``upstreams/levels.py``): the next change must send the level it wants.

The sends here are plain async functions standing for an upstream that answers, fails or is
slow; the end-to-end cases (clients leaving at once, a refused level) are in
``tests/test_proxying.py``.
"""

from __future__ import annotations

import contextlib

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.abc import TaskGroup

from agent_gateway.errors import GatewayError, UpstreamUnavailable
from agent_gateway.upstreams.levels import Level


class _Upstream:
    """Takes each level it is sent once ``go`` is set for it; fails the first ``fails`` sends of a level."""

    def __init__(self) -> None:
        self.go: dict[str, anyio.Event] = {}
        self.fails: dict[str, int] = {}
        self.sent: list[str] = []
        self.holds: str | None = None

    async def send(self, level: types.LoggingLevel) -> bool:
        self.sent.append(level)
        if level in self.go:
            await self.go[level].wait()
        if self.fails.get(level):
            self.fails[level] -= 1
            raise UpstreamUnavailable("up", "connection lost")
        self.holds = level
        return True


async def _tried(level: Level, value: types.LoggingLevel) -> None:
    """``apply`` as the gateway runs it (``proxy._set_level``): a failure is a warning."""
    with contextlib.suppress(GatewayError):
        await level.apply(value)


async def _applied(level: Level, value: types.LoggingLevel) -> None:
    level.ask(value)
    await level.apply(value)


async def _info_on_its_way(tg: TaskGroup, upstream: _Upstream, level: Level, fails: int = 0) -> None:
    """``level`` at debug, then info asked and on its way upstream, held there until its ``go``
    is set (and failing then if ``fails``)."""
    await _applied(level, "debug")
    upstream.go["info"], upstream.fails = anyio.Event(), {"info": fails}
    level.ask("info")
    tg.start_soon(_tried, level, "info")
    await _until(lambda: upstream.sent == ["debug", "info"])


async def test_a_send_that_fails_behind_later_ones_leaves_no_change_unsent() -> None:
    # info fails while debug, then info again, wait their turns: the upstream ends at info.
    # Before, the failed one set the level asked back to the one answered before (debug), and
    # a later client wanting debug was taken as served: nothing sent, the upstream at info.
    upstream = _Upstream()
    level = Level("up/1", upstream.send)
    async with anyio.create_task_group() as tg:
        await _info_on_its_way(tg, upstream, level, fails=1)
        for then in ("debug", "info"):
            level.ask(then)
            tg.start_soon(level.apply, then)
            await anyio.lowlevel.checkpoint()
        upstream.go["info"].set()
    assert upstream.holds == "info"
    assert level.asked != "debug", "a client wanting debug now would be taken as served"


async def test_a_send_cancelled_while_waiting_its_turn_leaves_no_change_unsent() -> None:
    upstream = _Upstream()
    level = Level("up/1", upstream.send)
    async with anyio.create_task_group() as tg:
        await _info_on_its_way(tg, upstream, level)
        with anyio.move_on_after(0.05):  # given up on while info is on its way
            await _applied(level, "debug")
        upstream.go["info"].set()
    assert upstream.holds == "info"
    assert level.asked != "debug", "a client wanting debug now would be taken as served"


async def test_a_change_back_after_a_send_given_up_on_is_sent() -> None:
    # Out of time, a setLevel may still be applied upstream: the level it runs at is not known,
    # so a change back to the level before is sent, not skipped as held already.
    upstream = _Upstream()
    level = Level("up/1", upstream.send)
    await _applied(level, "debug")
    upstream.go["error"] = anyio.Event()
    with anyio.move_on_after(0.05):
        await _applied(level, "error")
    await _applied(level, "debug")
    assert upstream.sent == ["debug", "error", "debug"]


async def _until(done: object) -> None:
    assert callable(done)
    with anyio.fail_after(5):
        while not done():
            await anyio.sleep(0.01)
