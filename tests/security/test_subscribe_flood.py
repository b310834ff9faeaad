"""Each ``resources/subscribe`` a client sends is a request the gateway makes upstream inside
the upstream's ``max_concurrency`` (200) guard; it was counted under none of the client's
own bounds but its session's ``max_subscriptions`` (1,000), so one client's 260 concurrent
subscribes to an upstream a little slow to answer them took every slot, and a bystander's
tool call was refused. Now a subscribe is a call in flight under the client's
``max_concurrency``. Found by a helper's attack (stop 50).
"""

from __future__ import annotations

import anyio
import mcp_types as types

from tests.security.test_set_level_flood import ATTACK, BOUND, attacked
from tests.servers import watched
from tests.support import serving_upstream

CLIENT_LIMIT = 64  # a policy's max_concurrency by default (the upstream's: 200)


async def test_one_clients_subscribes_do_not_take_a_bystanders_upstream_slots() -> None:
    seen: list[tuple[str, str]] = []
    most = [0]
    # Each subscribe is held upstream until the bystander has been served: held 4 s, on a
    # loaded machine the 260 requests came in slower than the first were answered, fewer than
    # the client's 64 were ever held at once, and the wait below never ended (CI, 2026-12-08).
    release = anyio.Event()
    server = watched.build(seen, subscribe_delay=BOUND, most=most, release=release)

    @server.tool
    def echo(text: str) -> str:
        return text

    async with serving_upstream(server) as url, attacked(url, "u__echo") as (gw, bystander, http, headers):

        async def subscribe(n: int) -> None:
            body = {
                "jsonrpc": "2.0",
                "id": n + 1,
                "method": "resources/subscribe",
                "params": {"uri": f"item://{n}"},
            }
            await http.post(gw.url, headers=headers, json=body)

        result: types.CallToolResult | None = None
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                for n in range(ATTACK):
                    tg.start_soon(subscribe, n)
                while most[0] < CLIENT_LIMIT - 4:  # the attacker's subscribes held upstream
                    await anyio.sleep(0.02)
                result = await bystander.call_tool("u__echo", {"text": "during"})
                release.set()  # the attack has made its point
                tg.cancel_scope.cancel()
    assert most[0] <= CLIENT_LIMIT
    assert result is not None
    text = result.content[0].text if isinstance(result.content[0], types.TextContent) else ""
    assert not result.is_error, (
        f"the bystander was refused while one client subscribed by the hundred: {text}"
    )
