"""The tool index's turns: a party's users queue behind one another, so every other party
waits behind at most one of them, however many it sends (``search/turns.py``)."""

from __future__ import annotations

import anyio
import httpx
from anyio import wait_all_tasks_blocked
from fastmcp import FastMCP

from agent_gateway.search.engine import INDEXING
from agent_gateway.search.tools import SEARCH_TOOLS
from agent_gateway.search.turns import Turns
from tests.support import running_gateway, serving_upstream
from tests.test_gateway import modern_request
from tests.test_proxying import BOUND


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


async def test_anonymous_clients_at_two_addresses_take_turns_as_two_parties() -> None:
    # Without auth every client's subject is "anonymous"; the gateway tells them apart by
    # address (each its own limits), and so must the index's turns, or one anonymous client's
    # flood put every other's search behind all of it.
    box = FastMCP("box")
    for i in range(3):
        box.tool(lambda: "ok", name=f"tool_{i}", description=f"Does thing number {i}.")
    second = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with (
        serving_upstream(box) as url,
        running_gateway({"upstreams": {"box": {"url": url}}, "search": {"mode": "on"}}) as gw,
        httpx.AsyncClient(timeout=BOUND) as flooder,
        httpx.AsyncClient(timeout=BOUND, transport=second) as bystander,
    ):
        turns: Turns = gw.gateway.search._turns  # pyright: ignore[reportPrivateUsage]
        answers: list[str] = []
        parties = 0

        async def search(http: httpx.AsyncClient, query: str) -> None:
            body, headers = modern_request(SEARCH_TOOLS, {"query": query})
            answers.append(
                (await http.post(gw.url, json=body, headers=headers)).json()["result"]["content"][0]["text"]
            )

        # The index busy (an upstream re-indexed, say) until the searches are all waiting.
        async with anyio.create_task_group() as tg, turns.taken(INDEXING):
            for i in range(5):
                tg.start_soon(search, flooder, f"thing {i}")
            tg.start_soon(search, bystander, "thing number")
            with anyio.fail_after(BOUND):
                while turns.users() < 7:
                    await anyio.sleep(0.01)
            parties = turns.parties()
    assert parties == 3  # the index's own, and one for each anonymous client
    assert len(answers) == 6
