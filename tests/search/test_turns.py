"""The tool index's turns: a party's users queue behind one another, so every other party
waits behind at most one of them, however many it sends (``search/turns.py``)."""

from __future__ import annotations

import anyio
from anyio import wait_all_tasks_blocked

from agent_gateway.search.turns import Turns


async def test_a_party_sending_many_holds_one_place_in_the_queue() -> None:
    turns, served, release, queued = Turns(), list[str](), anyio.Event(), 0

    async def use(party: str, name: str) -> None:
        async with turns.taken(party):
            served.append(name)
            if name == "flood-0":
                await release.wait()

    async with anyio.create_task_group() as tg:
        for name in ["flood-0", *(f"flood-{i}" for i in range(1, 21)), "bystander"]:
            tg.start_soon(use, name.partition("-")[0], name)
            await wait_all_tasks_blocked()  # each has taken its place in the queue, in turn
        queued = turns.parties()
        release.set()
    assert queued == 2
    # Without turns by party, first come first served: the bystander after all 21.
    assert served[:3] == ["flood-0", "bystander", "flood-1"]
    assert served[3:] == [f"flood-{i}" for i in range(2, 21)]
    assert turns.parties() == 0
