"""Progress an upstream reports while it reads a resource or renders a prompt reaches the client
that asked, under the client's own token, in both eras (the SDK's client takes a progress
callback only for ``tools/call``: these requests go out with a token of the gateway's)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.dispatcher import ProgressFnT

from tests.replicas.test_store import ACCEPT, opened
from tests.test_proxying import BOUND, MODES, UPSTREAMS, recorded_gateway

Reports = list[tuple[float, float | None, str | None]]


def collecting(into: Reports) -> ProgressFnT:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        into.append((progress, total, message))

    return on_progress


async def all_of(reports: Reports, count: int) -> Reports:
    with anyio.fail_after(BOUND):
        while len(reports) < count:
            await anyio.sleep(0.01)
    return reports


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_reads_and_a_renders_progress_reach_the_client_that_asked(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    read: Reports = []
    rendered: Reports = []
    other_read: Reports = []
    answers: list[types.ReadResourceResult] = []

    def reading(uri: str) -> types.ReadResourceRequest:
        return types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=uri))

    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, seen),
        Client(gw.url, mode=mode) as client,
        Client(gw.url, mode=mode) as other,
    ):
        async with anyio.create_task_group() as tg:  # two clients' reads at once, on one session
            tg.start_soon(
                partial(other.session.send_request, progress_callback=collecting(other_read)),
                reading("slow://2"),
                types.ReadResourceResult,
            )
            answers.append(
                await client.session.send_request(
                    reading("slow://3"), types.ReadResourceResult, progress_callback=collecting(read)
                )
            )
        params = types.GetPromptRequestParams(name="rec__drafted", arguments={"steps": "2"})
        draft = await client.session.send_request(
            types.GetPromptRequest(params=params),
            types.GetPromptResult,
            progress_callback=collecting(rendered),
        )
        await all_of(read, 3)
        await all_of(other_read, 2)
        await all_of(rendered, 2)
        reads = seen.of("read")
    assert isinstance(answers[0].contents[0], types.TextResourceContents)
    assert answers[0].contents[0].text == "read in 3"
    assert isinstance(draft.messages[0].content, types.TextContent)
    assert draft.messages[0].content.text == "drafted in 2"
    # Before: none of these (only a tools/call's progress was relayed); each to its own client.
    assert read == [(float(n), 3.0, f"read {n}") for n in range(1, 4)]
    assert other_read == [(1.0, 2.0, "read 1"), (2.0, 2.0, "read 2")]
    assert rendered == [(1.0, 2.0, "draft 1"), (2.0, 2.0, "draft 2")]
    # The upstream got tokens of the gateway's, not the clients' (their request ids).
    tokens = [str(r["meta"].get("progressToken")) for r in reads]
    assert all(token.startswith("gw-") for token in tokens), tokens
    assert len(set(tokens)) == 2


@pytest.mark.parametrize("token", [True, False])
async def test_a_bool_progress_token_asks_for_no_progress(token: bool, tmp_path: Path) -> None:
    """As the SDK reads a token: true is no token, never 1 (another request's, perhaps)."""
    params = {"name": "rec__drafted", "arguments": {"steps": "2"}, "_meta": {"progressToken": token}}
    async with (
        recorded_gateway("http", tmp_path, protocol="legacy") as (gw, _),
        httpx.AsyncClient(timeout=BOUND) as http,
    ):
        headers = {**ACCEPT, **await opened(http, gw.url)}
        answer = await http.post(
            gw.url,
            json={"jsonrpc": "2.0", "id": 2, "method": "prompts/get", "params": params},
            headers=headers,
        )
    assert "drafted in 2" in answer.text
    assert "notifications/progress" not in answer.text  # before: reports under 1 (or 0)


@pytest.mark.parametrize(("transport", "protocol"), UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_completions_progress_reaches_the_client_that_asked(
    transport: str, protocol: str, mode: str, tmp_path: Path
) -> None:
    """As a read's: before, a completion went upstream with no token, and the upstream, which
    reports progress to a client that asks directly, reported none."""
    completed: Reports = []
    params = types.CompleteRequestParams(
        ref=types.PromptReference(type="ref/prompt", name="rec__drafted"),
        argument=types.CompletionArgument(name="steps", value="3"),
    )
    async with (
        recorded_gateway(transport, tmp_path, protocol=protocol) as (gw, _),
        Client(gw.url, mode=mode) as client,
    ):
        answer = await client.session.send_request(
            types.CompleteRequest(params=params),
            types.CompleteResult,
            progress_callback=collecting(completed),
        )
        await all_of(completed, 3)
    assert answer.completion.values == ["3"]
    assert completed == [(float(n), 3.0, f"complete {n}") for n in range(1, 4)]
