"""Clients take turns at an upstream whose pings say it has calls queued, or that is full
(``upstreams/queueing.py``).

Before, every call was sent at once, whoever sent it, and an upstream that works on one request
at a time worked through them in the order they came: one client keeping 32 calls of a fast
tool in flight put ~31 of its calls ahead of each of a bystander's at the upstream itself. Now
the gateway pings such an upstream while it is busy, sends at most a window of calls when the
pings come back late, and serves the calls waiting client by client.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import statistics
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import mcp_types as types
import pytest
from mcp import Client

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamBusy
from agent_gateway.upstreams.guard import Guard
from agent_gateway.upstreams.queueing import FLOOR, CallQueue, Turn
from tests.security.test_hostile_load import client
from tests.support import RunningGateway, python_upstream, running_gateway

TOKENS = {"B": "bystander-token-0123456789", "H": "hog-token-0123456789"}
HOG_CALLS = 32
"""The flooding client's calls in flight, each sent again as soon as it is answered. With 16,
a run with three pytest workers saw a median of 9 ahead of the bystander's calls, against
its bound of 8: 32 leave the bound (16) twice what turns give on a loaded machine (5-12)."""


@asynccontextmanager
async def _clients() -> AsyncIterator[tuple[RunningGateway, Client, Client]]:
    """A gateway with bearer auth in front of ``tests/servers/serial.py``: bystander, hog."""
    tokens = [{"name": "bystander", "token": "${B}", "policy": "operators"}, {"name": "hog", "token": "${H}"}]
    config = {
        "upstreams": {"serial": python_upstream("serial.py")},
        "auth": {"mode": "bearer", "tokens": tokens, "policies": {"operators": {"admin": True}}},
    }
    async with (
        running_gateway(config, environ=TOKENS) as gw,
        client(gw.url, TOKENS["B"]) as bystander,
        client(gw.url, TOKENS["H"]) as hog,
    ):
        yield gw, bystander, hog


async def _work(c: Client, who: str) -> None:
    result = await c.call_tool("serial__work", {"who": who})
    assert not result.is_error, result
    assert isinstance(block := result.content[0], types.TextContent)
    assert block.text == who


async def _shown(gw: RunningGateway, seen: Callable[[dict[str, Any]], bool]) -> None:
    """Wait until ``/status`` shows the upstream as ``seen`` says, then until its row on the
    status page shows whether its calls are held back likewise (each is rendered once a second
    at most, so either may be a moment behind the other)."""
    headers = {"Authorization": f"Bearer {TOKENS['B']}"}
    async with httpx.AsyncClient(base_url=gw.base, headers=headers) as http:
        with anyio.fail_after(30):
            while not seen(serial := (await http.get("/status")).json()["upstreams"][0]):
                await anyio.sleep(0.05)
            held_back = serial["window"] is not None
            while _held_back_shown(_row((await http.get("/")).text, "serial")) != held_back:
                await anyio.sleep(0.05)


def _held_back_shown(row: str) -> bool:
    """Whether the row's calls in flight show the window, the calls sent and those waiting."""
    return re.search(r"\(window \d+: \d+ sent, \d+ waiting\)</td>", row) is not None


def _row(page: str, upstream: str) -> str:
    """The upstream's row of the status page's table of upstreams."""
    row = page[page.index(f'data-name="{upstream}"') :]
    return row[: row.index("</tr>")]


def _ahead(starts: list[str]) -> list[int]:
    """For each of the bystander's calls after its first, the hog's calls the upstream started
    since the bystander's call before it (the bystander sends the next once answered)."""
    marks = [i for i, who in enumerate(starts) if who == "bystander"]
    return [later - earlier - 1 for earlier, later in itertools.pairwise(marks)]


async def test_a_bystanders_calls_wait_at_the_upstream_behind_a_few_of_a_flooding_clients_not_all() -> None:
    async with _clients() as (gw, bystander, hog):
        queue = gw.gateway.pool.get("serial").session().queue
        assert queue is not None
        await _until(lambda: queue.fastest < math.inf)  # pinged once as it connected, idle
        answered = 0

        async def flood() -> None:
            nonlocal answered
            while True:
                await _work(hog, "hog")
                answered += 1

        async with anyio.create_task_group() as tg:
            for _ in range(HOG_CALLS):
                tg.start_soon(flood)
            with anyio.fail_after(120):
                for _ in range(20):
                    await _work(bystander, "bystander")
            await _shown(
                gw,
                lambda serial: (
                    serial["window"] is not None
                    and 0 < serial["sent"] <= serial["in_flight"]
                    and serial["waiting"] > 0
                ),
            )
            tg.cancel_scope.cancel()
        await _shown(gw, lambda serial: serial["window"] is None and serial["sent"] == serial["waiting"] == 0)
        result = await bystander.call_tool("serial__starts", {})
        starts = result.structured_content["result"] if result.structured_content else []
        ahead = _ahead(starts)[-10:]  # once the window has settled
        # Sent all at once, ~31 of the hog's calls were ahead of each; in turns, 5-12 (the window,
        # the hog's turn before the bystander's, and those the hog sent while the bystander
        # read its answer and sent its next call).
        assert statistics.median(ahead) <= HOG_CALLS // 2, ahead
        assert answered >= 20, "the flooding client's calls are served too, in their turns"


def _late(queue: CallQueue) -> None:
    """Three pings, the last two queued 100 ms at the upstream."""
    whole = queue.window
    queue.observed(0.001, 0.0)
    queue.observed(0.1, 0.0)
    assert queue.window == whole, "one late ping may be the gateway's own lag"
    queue.observed(0.1, 0.0)


async def test_calls_past_the_window_are_sent_client_by_client_in_turn() -> None:
    queue = CallQueue("up", 100)
    sent: list[str] = []
    release = anyio.Event()

    async def call(who: str) -> None:
        async with _turn(queue, who, 10):
            sent.append(who)
            await release.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(FLOOR):
            tg.start_soon(call, "a")
        await _until(lambda: queue.sent == FLOOR)
        _late(queue)
        assert queue.window == FLOOR
        for n, who in enumerate(("a", "a", "a", "b", "c", "b"), start=1):
            tg.start_soon(call, who)
            await _until(lambda n=n: queue.waiting == n)  # in this order
        assert queue.waiting == 6
        release.set()
    assert sent[FLOOR:] == ["a", "b", "c", "a", "b", "a"]


async def test_a_call_not_sent_within_its_wait_is_refused_and_leaves_no_place_behind() -> None:
    queue = CallQueue("up", 100)
    async with _holding(queue, FLOOR):
        _late(queue)
        with pytest.raises(UpstreamBusy, match=r"not sent within 0\.05s"):
            async with _turn(queue, "b", 0.05):
                pytest.fail("sent past the window")
        assert queue.waiting == 0
        with anyio.CancelScope() as scope:  # one cancelled while it waits: its place goes too
            scope.cancel()
            async with _turn(queue, "b", 10):
                pytest.fail("sent past the window")
        assert queue.waiting == 0

        async def given_then_cancelled() -> None:
            async with _turn(queue, "b", 10):
                pytest.fail("sent though cancelled")

        # Given its turn and cancelled in the same step, before it runs again: asyncio's own
        # cancel, which lands at once (anyio delivers a scope's on the loop's next pass).
        waiter = asyncio.ensure_future(given_then_cancelled())
        await _until(lambda: queue.waiting == 1)
        queue.observed(0.001, 0.0)  # in time: one more may be sent, and it is given the turn
        assert queue.sent == FLOOR + 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await _until(lambda: queue.sent == FLOOR)  # its turn given back
    assert queue.sent == 0


async def test_the_window_widens_back_to_max_concurrency_while_pings_are_answered_in_time() -> None:
    queue = CallQueue("up", 100)
    release = anyio.Event()

    async def held() -> None:
        async with _turn(queue, "b", 10):
            await release.wait()

    async with _holding(queue, FLOOR + 3) as hold, anyio.create_task_group() as tg:
        _late(queue)
        assert queue.window == FLOOR
        assert queue.sent == FLOOR + 3  # sent before: not taken back
        hold(50)  # its share of the places to wait (max_concurrency, 100)
        await _until(lambda: queue.waiting == 50)
        for _ in range(25):  # another client's share of the 50 left
            tg.start_soon(held)
        await _until(lambda: queue.waiting == 75)
        widths = []
        for _ in range(6):
            queue.observed(0.001, 0.0)  # in time, while calls wait to be sent
            widths.append(queue.window)
        # Past the 7 in flight: a step after a late ping, then twice as wide.
        assert widths == [8, 16, 32, 64, 100, 100]
        assert queue.sent == 82  # sent as it widened
        assert queue.waiting == 0
        release.set()
    assert queue.sent == 0


async def test_the_window_narrows_to_half_of_the_calls_in_flight_at_most_at_each_late_ping() -> None:
    queue = CallQueue("up", 100)
    async with _holding(queue, 64):
        _late(queue)  # by Little's law 64 x 6 ms / 100 ms: 3
        assert queue.window == 32
        queue.observed(0.1, 0.0)
        assert queue.window == 32, "its calls in flight are not answered yet"


async def test_a_ping_late_by_the_gateways_own_lag_leaves_the_window_and_the_fastest_ping_alone() -> None:
    queue = CallQueue("up", 100)
    async with _holding(queue, FLOOR * 2):
        queue.observed(0.010, 0.0)
        for _ in range(3):  # 100 ms, of which 3 passes of a loop 30 ms behind: 10 ms at the upstream
            queue.observed(0.100, 0.030)
        assert queue.window == 100
        queue.observed(0.005, 0.002)  # not 0 ms: what a misjudged lag says is never the fastest
        assert queue.fastest == 0.005


async def test_a_ping_left_unanswered_is_not_counted() -> None:
    queue = CallQueue("up", 100)
    pings: list[str | None] = ["health check: no answer within 10s"]

    async def ping() -> str | None:
        return pings.pop(0) if pings else None

    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.watch, ping)
        await _until(lambda: not pings)
        await anyio.lowlevel.checkpoint()
        assert queue.fastest == math.inf, "a ping with no answer is no measure of the upstream"
        async with _holding(queue, FLOOR):  # busy: pinged again, and answered
            await _until(lambda: queue.fastest < math.inf)
        tg.cancel_scope.cancel()


async def test_waiting_calls_are_bounded_by_max_concurrency_and_sent_on_when_the_session_is_lost() -> None:
    queue = CallQueue("up", 8)
    outcomes: list[str] = []

    async def waiting(client: str) -> None:
        async with _turn(queue, client, 10):
            outcomes.append("sent")

    async with _holding(queue, FLOOR), anyio.create_task_group() as tg:
        _late(queue)
        for n in range(1, 9):  # a client each: none over its share of the places
            tg.start_soon(waiting, f"b{n}")
            await _until(lambda n=n: queue.waiting == n)
        with pytest.raises(UpstreamBusy, match="8 calls are waiting for their turn already"):
            async with _turn(queue, "c", 10):
                pytest.fail("queued past the bound")
        _lose(queue)  # its connection lost: each goes on to fail there, saying so
        await _until(lambda: len(outcomes) == 8)
        assert queue.waiting == 0
        async with _turn(queue, "c", 10):  # one that took the session just before
            assert queue.sent == FLOOR + 1


async def test_a_lost_session_sends_on_its_own_waiting_calls_and_the_others_wait_on() -> None:
    # One queue per upstream, for its shared session and its dedicated ones: a dedicated
    # session lost (its process exited) fails its own waiting calls at once, and the calls
    # waiting for the upstream's other sessions keep their places.
    guard, queue = _capped(2)
    mine, other = _Session(), _Session()
    release = anyio.Event()
    sent: list[str] = []

    async def holder(who: str) -> None:
        async with _call(queue, guard, who):
            await release.wait()

    async def waiting(who: str, session: _Session) -> None:
        async with _turn(queue, who, 10, session):
            sent.append(who)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder, "a")
        tg.start_soon(holder, "d")
        await _until(lambda: guard.in_flight == 2)  # full
        tg.start_soon(waiting, "b", mine)
        await _until(lambda: queue.waiting == 1)
        tg.start_soon(waiting, "c", other)
        await _until(lambda: queue.waiting == 2)
        assert mine.waiting == other.waiting == 1  # each session in use while its call waits
        _lose(queue, mine)
        await _until(lambda: sent == ["b"])  # on at once, to fail at its session
        assert queue.waiting == 1
        assert (mine.waiting, other.waiting) == (0, 1)
        release.set()  # a's or d's slot is c's
    assert sent == ["b", "c"]
    assert queue.sent == guard.in_flight == guard.reserved == 0


async def test_once_the_shared_session_is_lost_the_window_is_whole_and_the_fastest_ping_kept() -> None:
    # The queue outlives the session whose pings narrowed its window. The fastest ping stays:
    # the next session's first ping may meet dedicated sessions' calls in flight.
    queue = CallQueue("up", 100)
    async with _holding(queue, FLOOR) as hold:
        _late(queue)
        hold(2)
        await _until(lambda: queue.waiting == 2)
        assert queue.window == FLOOR
        queue.reset()  # as connection.py does on the shared session's loss
        assert queue.window == 100
        assert queue.fastest == 0.001
        assert queue.waiting == 0  # sent as it widened
        assert queue.sent == FLOOR + 2


async def test_once_the_shared_session_is_lost_the_next_one_is_sent_calls_as_they_come() -> None:
    # One queue per upstream outlives its shared session: the window its pings narrowed held
    # the next session's calls (and a per_client upstream's dedicated ones) back, with nothing
    # to widen it until that session was busy.
    async with _clients() as (gw, bystander, _):
        upstream = gw.gateway.pool.get("serial")
        lost = upstream.session()
        await _until(lambda: upstream.queue.fastest < math.inf)  # pinged once as it connected
        _late(upstream.queue)
        assert upstream.queue.held_back == FLOOR
        lost.lose("unanswered health check")  # as the health check gives it up
        await _until(lambda: upstream.queue.held_back is None)
        await _until(lambda: upstream.live_session() not in (None, lost), 30)  # connected again
        await _work(bystander, "bystander")


@pytest.mark.parametrize("session", ["shared", "per_client"])
async def test_a_per_client_stdio_upstreams_shared_process_is_not_pinged_for_the_window(
    tmp_path: Path, session: str
) -> None:
    # The window's pings judge the process they reach. A per_client stdio upstream's calls
    # go to processes of their own, so its shared process is not pinged for them: its late
    # answers (it serves the calls with no client session, an agent run's) held every
    # client's calls back. A shared one is pinged as it connects, which shows the record.
    requests = tmp_path / "requests"
    upstream = python_upstream(
        "raw_stdio.py", session=session, env={"RAW_REQUESTS": str(requests)}, health={"interval": None}
    )
    async with running_gateway({"upstreams": {"raw": upstream}}) as gw, Client(gw.url) as client:
        for _ in range(FLOOR + 1):
            assert not (await client.call_tool("raw__hello", {})).is_error
        if session == "shared":
            await _until(lambda: gw.gateway.pool.get("raw").queue.fastest < math.inf)
        lines = requests.read_text().splitlines()
    by_process: dict[str, list[str]] = {}
    for line in lines:
        pid, method = line.split()
        by_process.setdefault(pid, []).append(method)
    shared, *dedicated = by_process.values()  # the shared process started first
    assert bool(dedicated) is (session == "per_client")
    assert ("ping" in shared) is (session == "shared")
    assert all("ping" not in methods for methods in dedicated)


async def test_once_idle_the_window_is_whole_again_and_the_fastest_ping_measured_anew() -> None:
    queue = CallQueue("up", 100)
    seconds = [0.001]  # what the upstream takes to answer a ping, idle

    async def ping() -> None:
        await anyio.sleep(seconds[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.watch, ping)
        await _until(lambda: queue.fastest < math.inf)
        async with _holding(queue, FLOOR * 2):
            queue.observed(0.1, 0.0)
            queue.observed(0.1, 0.0)
            assert queue.window == FLOOR
            seconds[0] = 0.05  # its route got slower for good
        await _until(lambda: queue.fastest >= 0.05)  # measured again once idle, not kept at 1 ms
        assert queue.window == 100
        tg.cancel_scope.cancel()


async def test_at_the_whole_max_concurrency_a_client_with_no_call_there_waits_for_the_next_slot() -> None:
    # Before, every call past max_concurrency was refused at once: greedy clients, each sending
    # again the moment one of its calls ended, kept the upstream full, and a client arriving
    # never found a slot. Now one with none there waits for the next, sent for it first.
    guard, queue = _capped(2, share=2)  # client a may take both slots
    ends = [anyio.Event(), anyio.Event()]
    served: list[str] = []

    async def held(end: anyio.Event) -> None:
        async with _call(queue, guard, "a"):
            await end.wait()

    async def call(who: str) -> None:
        async with _call(queue, guard, who):
            served.append(who)

    async with anyio.create_task_group() as tg:
        for end in ends:
            tg.start_soon(held, end)
        await _until(lambda: queue.sent == 2)
        tg.start_soon(call, "b")
        await _until(lambda: queue.waiting == 1)
        tg.start_soon(call, "c")
        await _until(lambda: queue.waiting == 2)
        for who in ("a", "b"):  # holding calls there; with a call waiting already
            with pytest.raises(
                UpstreamBusy,
                match=r"^upstream 'up': 2 calls in flight, the limit \(max_concurrency\) is 2; a client "
                "with calls in flight or waiting here is refused, one with none waits for the next slot$",
            ):
                async with _turn(queue, who, 10):
                    pytest.fail("sent past the cap")
        assert served == []
        ends[0].set()  # one of a's calls ends: its slot goes to b, then (b's ended) to c
        await _until(lambda: served == ["b", "c"])
        assert queue.sent == 1
        ends[1].set()
    assert queue.sent == guard.in_flight == guard.reserved == 0


async def test_a_call_waiting_at_the_whole_max_concurrency_is_refused_after_its_wait() -> None:
    guard, queue = _capped(1)
    async with _call(queue, guard, "a"):
        with pytest.raises(
            UpstreamBusy,
            match=r"^upstream 'up': not sent within 0.05s: every one of the upstream's 1 slots \(its "
            r"max_concurrency\) stayed taken; retry later$",
        ):
            async with _turn(queue, "b", 0.05):
                pytest.fail("sent past the cap")
        assert queue.waiting == 0


async def test_at_the_whole_max_concurrency_a_client_given_its_turn_waits_in_no_second_place() -> None:
    # Given its turn, a call is counted by the guard only once it runs: before, that client's
    # next call meanwhile found it holding nothing and took a second place to wait.
    guard, queue = _capped(1)
    served: list[str] = []

    async def call(who: str) -> None:
        async with _call(queue, guard, who):
            served.append(who)

    async with anyio.create_task_group() as tg:
        async with _call(queue, guard, "a"):
            tg.start_soon(call, "b")
            await _until(lambda: queue.waiting == 1)
            with pytest.raises(  # every place taken: the reason is the slots, not a slow upstream
                UpstreamBusy,
                match=r"^upstream 'up': 1 calls are waiting for their turn already \(its max_concurrency\): "
                "every one of the upstream's 1 slots",
            ):
                async with _turn(queue, "c", 10):
                    pytest.fail("waited past the places")
        # a's turn given back: b's is given, b not yet running
        with pytest.raises(UpstreamBusy, match="a client with calls in flight or waiting here is refused"):
            async with _turn(queue, "b", 10):
                pytest.fail("a second place to wait")
    assert served == ["b"]


@pytest.mark.parametrize("how", ["lost", "closed"])
async def test_once_the_session_is_lost_a_call_at_the_whole_max_concurrency_goes_on_to_fail_there(
    how: str,
) -> None:
    # Neither refused for the cap nor waiting for calls that are failing: the session is gone
    # (its calls fail as they take it, before the guard: session.py's _calling). Closed: a
    # dedicated session its client's end closed, as a call took it just before.
    guard, queue = _capped(1)
    session = _Session()
    async with _turn(queue, "a", 10, session):
        if how == "lost":
            _lose(queue, session)
        else:
            session.client = None
            queue.gone(session)
        with guard.admitted("a"):  # full
            async with _turn(queue, "a", 10, session), _turn(queue, "b", 10, session):
                assert queue.sent == 3


async def test_a_slot_given_to_a_call_cancelled_before_it_runs_goes_to_the_next_one() -> None:
    # The slot is kept at the guard for the call given it until that call runs: one cancelled
    # first must give it back, or the upstream has a slot fewer for good.
    guard, queue = _capped(2, share=2)
    served: list[str] = []

    async def call(who: str) -> None:
        async with _call(queue, guard, who):
            served.append(who)

    async with _call(queue, guard, "a"), anyio.create_task_group() as tg:
        async with _call(queue, guard, "a"):
            given = asyncio.ensure_future(call("b"))  # asyncio's cancel lands at once
            await _until(lambda: queue.waiting == 1)
            tg.start_soon(call, "c")
            await _until(lambda: queue.waiting == 2)
        given.cancel()  # given a's slot as its call ended, and cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await given
        await _until(lambda: served == ["c"])


@pytest.mark.parametrize("other", [None, "b"], ids=["the gateway's own call", "another call of its client"])
async def test_a_slot_held_by_a_call_that_takes_no_turn_is_waited_for_and_kept_for_the_call_given_it(
    other: str | None,
) -> None:
    # The gateway's own calls (and a held call's after its first round; a dedicated session's
    # until one queue per upstream) take no turn here but hold the upstream's slots. Before, the
    # turns went by their own count: a call past the cap took its turn and was refused at the
    # guard at once, and a slot given to a waiting call could be taken by one of those calls
    # before it ran. Kept per client (a version of this stop), another call of that client (its
    # dedicated session's, sharing the guard) took it past the cap, and the waiting call was
    # refused after its wait.
    guard, queue = _capped(2)
    served: list[str] = []

    async def call(who: str) -> None:
        async with _call(queue, guard, who):
            served.append(who)

    async with _call(queue, guard, "a"), anyio.create_task_group() as tg:
        with guard.admitted(None):  # the gateway's own call takes the other slot
            tg.start_soon(call, "b")
            await _until(lambda: queue.waiting == 1)
        # Its end gave the slot to b's waiting call, which does not run yet: it is that call's.
        with pytest.raises(UpstreamBusy, match=r"^upstream 'up': 2 calls in flight"), guard.admitted(other):
            pytest.fail("took the slot given to b's waiting call")
        await _until(lambda: served == ["b"])
    assert guard.in_flight == guard.reserved == 0


async def test_a_client_waits_in_as_many_places_as_it_leaves_free_and_another_still_finds_one() -> None:
    # Before, one client's calls could take every place to wait (max_concurrency of them) while
    # the window held calls back, and each other client's call was refused at once.
    queue = CallQueue("up", 8)

    async def waiting(client: str) -> None:
        async with _turn(queue, client, 10):
            pass

    async with _holding(queue, FLOOR), anyio.create_task_group() as tg:
        _late(queue)
        for n in range(1, 5):  # half the places, as its share of the upstream's slots
            tg.start_soon(waiting, "hog")
            await _until(lambda n=n: queue.waiting == n)
        with pytest.raises(
            UpstreamBusy, match="client 'hog' has 4 calls waiting for their turn here, and 4 of"
        ):
            async with _turn(queue, "hog", 10):
                pytest.fail("queued past its share")
        tg.start_soon(waiting, "bystander")
        await _until(lambda: queue.waiting == 5)
        _lose(queue)


async def test_a_client_with_a_fixed_share_waits_in_as_many_places_as_that_share() -> None:
    # A call past max_concurrency_per_client would wait its turn only to be refused at the
    # guard, keeping a place another client's call could use meanwhile.
    queue = CallQueue("up", 100, share=2)

    async def waiting() -> None:
        async with _turn(queue, "hog", 10):
            pass

    async with _holding(queue, FLOOR), anyio.create_task_group() as tg:
        _late(queue)
        for n in (1, 2):
            tg.start_soon(waiting)
            await _until(lambda n=n: queue.waiting == n)
        with pytest.raises(UpstreamBusy, match=r"2 at most \(max_concurrency_per_client\)"):
            async with _turn(queue, "hog", 10):
                pytest.fail("queued past its share")
        _lose(queue)


@asynccontextmanager
async def _holding(queue: CallQueue, calls: int) -> AsyncIterator[Callable[[int], None]]:
    """``calls`` of client a's sent and held until the block ends; it gets a function that
    sends (or queues) that many more, held alike."""
    release = anyio.Event()

    async def held() -> None:
        async with _turn(queue, "a", 10):
            await release.wait()

    async with anyio.create_task_group() as tg:

        def hold(more: int) -> None:
            for _ in range(more):
                tg.start_soon(held)

        hold(calls)
        await _until(lambda: queue.sent == calls)
        yield hold
        release.set()


async def test_a_slot_given_to_a_call_is_kept_until_its_upstream_call_is_admitted_in_a_task_of_its_own() -> (
    None
):
    # A held call (a modern client that answers questions, calling a handshake-era upstream)
    # starts its upstream call in a task of HeldCalls' own, a loop pass after its turn. Before,
    # the slot was free again as its turn began, and another call could take it in that pass.
    guard, queue = _capped(2)
    admitted: list[str] = []

    async def upstream_call() -> None:
        with guard.admitted("b"):
            admitted.append("b")

    async def held_call() -> None:
        async with _turn(queue, "b", 10), anyio.create_task_group() as tg:
            tg.start_soon(upstream_call)  # runs a loop pass later
            with (
                pytest.raises(UpstreamBusy, match=r"^upstream 'up': 2 calls in flight"),
                guard.admitted(None),
            ):
                pytest.fail("the gateway's own call took the slot given to b")

    async with _call(queue, guard, "a"), anyio.create_task_group() as tg:
        with guard.admitted(None):  # the gateway's own call takes the other slot
            tg.start_soon(held_call)
            await _until(lambda: queue.waiting == 1)
    assert admitted == ["b"]
    assert guard.in_flight == guard.reserved == 0


async def test_a_slot_kept_for_a_call_that_never_reaches_the_guard_is_given_on_as_its_turn_ends() -> None:
    # A call given its turn may fail before the guard admits it (its session's connection lost
    # as it takes it): the slot kept for it must not stay kept.
    guard, queue = _capped(2)
    served: list[str] = []

    async def failing() -> None:
        async with _turn(queue, "b", 10):
            pass  # no admission: it failed first

    async def call(who: str) -> None:
        async with _call(queue, guard, who):
            served.append(who)

    async with _call(queue, guard, "a"), anyio.create_task_group() as tg:
        with guard.admitted(None):  # the gateway's own call takes the other slot
            tg.start_soon(failing)
            await _until(lambda: queue.waiting == 1)
            tg.start_soon(call, "c")
            await _until(lambda: queue.waiting == 2)
        await _until(lambda: served == ["c"])
    assert guard.reserved == 0


def _capped(limit: int, share: int | None = None) -> tuple[Guard, CallQueue]:
    """An upstream's guard of ``limit`` slots (``share`` a client's), and its turns."""
    guard = Guard(
        "up", UpstreamConfig(url="http://up/mcp", max_concurrency=limit, max_concurrency_per_client=share)
    )
    return guard, CallQueue("up", limit, share, guard)


@dataclass(eq=False)
class _Session:
    """What the queue knows of the upstream session a call goes to (``queueing.Session``)."""

    lost: anyio.Event = field(default_factory=anyio.Event)
    client: object | None = "connected"
    waiting: int = 0
    used: float = 0.0


_SESSIONS: weakref.WeakKeyDictionary[CallQueue, _Session] = weakref.WeakKeyDictionary()
"""The session each queue's calls go to, unless a test gives one."""


def _turn(queue: CallQueue, who: str, wait: float, session: _Session | None = None) -> Turn:
    """``who``'s call to ``session``, in its turn, waiting ``wait`` seconds at most."""
    return queue.turn(who, lambda: wait, session or _SESSIONS.setdefault(queue, _Session()))


def _lose(queue: CallQueue, session: _Session | None = None) -> None:
    """The session lost, as ``UpstreamSession.lose`` does it."""
    session = session or _SESSIONS.setdefault(queue, _Session())
    session.lost.set()
    queue.gone(session)


@asynccontextmanager
async def _call(queue: CallQueue, guard: Guard, who: str) -> AsyncIterator[None]:
    """One call of ``who`` as the gateway makes it: its turn, then the guard's admission
    (``proxy.py``, then ``session.py``'s ``_calling``)."""
    async with _turn(queue, who, 10):
        with guard.admitted(who):
            yield


async def _until(done: object, bound: float = 20) -> None:
    assert callable(done)
    with anyio.fail_after(bound):
        while not done():
            await anyio.sleep(0.01)
