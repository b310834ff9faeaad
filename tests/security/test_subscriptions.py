"""Resource subscriptions against a client that asks for many: each session's bound, and a
session's end that leaves nothing subscribed upstream (a recording upstream behind a real
gateway, the official client downstream, in both eras).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent_gateway.downstream import subscription_bounds
from tests.servers import recorder, watched
from tests.support import RunningGateway, python_upstream, running_gateway, serving_upstream

# resources/subscribe is deprecated in 2026-07-28; these clients use it by the hundred.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

BOUND = 20.0
MANY = 100
SLOW_UNSUBSCRIBE = 0.1
"""Seconds the upstream takes to answer each unsubscribe: ``MANY`` of them one at a time
would take 10 s, twice what a session's end may take."""


@asynccontextmanager
async def watched_gateway(
    seen: list[tuple[str, str]], policy: dict[str, Any] | None = None, **delays: Any
) -> AsyncIterator[RunningGateway]:
    policies = {"auth": {"policies": {"default": policy}}} if policy else {}
    delays = {"unsubscribe_delay": SLOW_UNSUBSCRIBE} | delays
    async with serving_upstream(watched.build(seen, **delays)) as url:
        config = {"upstreams": {"w": {"url": url, "protocol": "legacy"}}} | policies
        async with running_gateway(config) as gw:
            yield gw


def _subscribed(seen: list[tuple[str, str]]) -> set[str]:
    """What the upstream is subscribed to now."""
    now: set[str] = set()
    for event, uri in seen:
        (now.add if event == "subscribe" else now.discard)(uri)
    return now


async def _wait(predicate: Any) -> None:
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.02)


@pytest.mark.parametrize("era", ["handshake", "modern"])
async def test_a_session_ended_holding_many_subscriptions_leaves_none_upstream(
    era: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 100 unsubscribes of 0.1 s each: one at a time they take 10 s, many at a time well under
    # a second alone, but on a machine loaded by three test workers 4 were left past the
    # gateway's 3 s. 6 s still fails the one-at-a-time gateway, with room for the load.
    monkeypatch.setattr(subscription_bounds, "RELEASE_TIMEOUT", 6.0)
    seen: list[tuple[str, str]] = []
    uris = [f"item://{n}" for n in range(MANY)]
    async with watched_gateway(seen) as gw:
        if era == "handshake":
            async with Client(gw.url, mode="legacy") as client:
                for uri in uris:
                    await client.subscribe_resource(uri)
                assert gw.gateway.subscriptions.count == MANY
        else:
            async with Client(gw.url) as client, client.listen(resource_subscriptions=uris):
                assert gw.gateway.subscriptions.count == MANY
        # The session's end takes them out of the gateway's tables at once...
        await _wait(lambda: gw.gateway.subscriptions.count == 0)
        # ...and unsubscribes each upstream, many at a time: none is left for nobody.
        await _wait(lambda: len([e for e in seen if e[0] == "unsubscribe"]) == MANY)
    assert _subscribed(seen) == set()
    assert sorted(uri for event, uri in seen if event == "unsubscribe") == sorted(uris)


async def test_a_listen_stream_naming_many_resources_subscribes_them_side_by_side() -> None:
    # Each subscribe is answered after a pause, as a remote upstream's round trip: one at a
    # time, the stream would open after MANY of them.
    seen: list[tuple[str, str]] = []
    most = [0]
    uris = [f"item://{n}" for n in range(MANY)]
    # Unsubscribes answered at once: this is about subscribes, and slow ones could outlast
    # a session's 3 s to let go of them on a loaded machine (then held till the upstream ends).
    async with watched_gateway(seen, subscribe_delay=0.05, unsubscribe_delay=0.0, most=most) as gw:
        async with Client(gw.url) as client, client.listen(resource_subscriptions=uris):
            assert gw.gateway.subscriptions.count == MANY
        assert most[0] > 1  # several in flight at once (before: one)
        await _wait(lambda: _subscribed(seen) == set())
        # One the catalog does not hold among them: refused by its name, none left upstream.
        async with Client(gw.url) as client:
            with pytest.raises(MCPError) as refused:
                async with client.listen(resource_subscriptions=[*uris[:40], "nothing://here", *uris[40:]]):
                    pass
        assert "nothing://here" in refused.value.error.message
        await _wait(lambda: gw.gateway.subscriptions.count == 0 and _subscribed(seen) == set())


async def test_a_session_is_refused_subscriptions_past_its_bound_and_no_more_reach_upstream() -> None:
    seen: list[tuple[str, str]] = []
    async with watched_gateway(seen, {"max_subscriptions": 5}) as gw:
        async with Client(gw.url, mode="legacy") as client:
            for n in range(5):
                await client.subscribe_resource(f"item://{n}")
            await client.subscribe_resource("item://4")  # held already: not one more
            with pytest.raises(MCPError) as refused:
                await client.subscribe_resource("item://5")
        assert refused.value.error.message == (
            "client limit: 6 resource subscriptions in one session; the limit (max_subscriptions) is 5"
        )
        async with Client(gw.url) as client:
            with pytest.raises(MCPError) as refused:
                async with client.listen(resource_subscriptions=[f"item://{n}" for n in range(6)]):
                    pass
            assert "6 resource subscriptions in one listen stream" in refused.value.error.message
            async with client.listen(resource_subscriptions=[f"item://{n}" for n in range(5)]):
                pass  # at the bound: served
        await _wait(lambda: _subscribed(seen) == set())
    assert sorted({uri for event, uri in seen if event == "subscribe"}) == [f"item://{n}" for n in range(5)]


async def test_an_upstream_session_lost_with_many_subscribers_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_gateway")
    log = tmp_path / "recorder.jsonl"
    upstream = python_upstream("recorder.py", env={"RECORDER_LOG": str(log)}, protocol="legacy")
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    async with running_gateway({"upstreams": {"rec": upstream}}) as gw, anyio.create_task_group() as tg:
        ready: list[Client] = []

        async def subscriber(done: anyio.Event) -> None:
            async with Client(gw.url, mode="legacy", message_handler=on_message) as client:
                await client.subscribe_resource("counter://value")
                ready.append(client)
                await done.wait()

        done = anyio.Event()
        for _ in range(5):
            tg.start_soon(subscriber, done)
        await _wait(lambda: len(ready) == 5)
        pid = (await ready[0].call_tool("rec__whoami", {})).structured_content["pid"]  # type: ignore[index]
        os.kill(pid, 9)
        await _wait(lambda: len(updates) == 5)  # each client is told to read it again
        done.set()
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == 1, lost
    assert "5 subscriptions of 5 sessions lost" in lost[0]


async def test_a_uri_and_its_alias_are_two_subscriptions_of_one_session() -> None:
    # Before, one session subscribed to counter://value and to rec+counter://value held one:
    # its updates came under the name subscribed last, and unsubscribing the other did nothing.
    updates: list[str] = []
    events: list[dict[str, Any]] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    async def updated(count: int) -> None:
        await client.call_tool("rec__updates", {"uri": "counter://value", "times": 1})
        with anyio.fail_after(BOUND):
            while len(updates) < count:
                await anyio.sleep(0.02)

    async with (
        serving_upstream(recorder.build(events.append)) as url,
        running_gateway({"upstreams": {"rec": {"url": url, "protocol": "legacy"}}}) as gw,
        Client(gw.url, mode="legacy", message_handler=on_message) as client,
    ):
        await client.subscribe_resource("counter://value")
        await client.subscribe_resource("rec+counter://value")
        await updated(2)  # one update upstream: one under each name
        both = sorted(updates)
        await client.unsubscribe_resource("counter://value")
        await updated(3)  # the alias still subscribed
        await client.unsubscribe_resource("rec+counter://value")
        count = gw.gateway.subscriptions.count
    assert both == ["counter://value", "rec+counter://value"]
    assert updates[2] == "rec+counter://value"
    assert count == 0
    upstream = [(e["event"], e["uri"]) for e in events if e.get("event") in ("subscribe", "unsubscribe")]
    assert upstream == [("subscribe", "counter://value"), ("unsubscribe", "counter://value")]
