"""A model endpoint that misbehaves at the HTTP level: a reply without end, a wait it asks for
past the run's deadline, a body past what a run reads, a compressed body. Each run ends with
why, and the endpoint sees its connection closed early."""

from __future__ import annotations

import gzip
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import pytest
from mcp import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent_gateway.agent.provider_http import MAX_REPLY_BYTES
from tests.agent.model_apis import Turn, openai_api
from tests.agent.test_ask_agent import ask, text
from tests.agent.test_models import SECRET, gateway_with_model, openai_model
from tests.support import serving

CHUNK = 1 << 20
SENT_BOUND = 4 * MAX_REPLY_BYTES
"""What the endpoint offers: a gateway reading it whole read four times a reply's bound."""


@dataclass
class Endpoint:
    """What the hostile endpoint saw: its requests' headers, and what it sent of its bodies."""

    headers: list[dict[str, str]] = field(default_factory=list)
    sent: int = 0
    ended: anyio.Event = field(default_factory=anyio.Event)


def hostile(how: str) -> tuple[Starlette, Endpoint]:
    """OpenAI's and Anthropic's routes, each answering ``how``."""
    seen = Endpoint()

    async def body(chunk: bytes, count: int | None) -> AsyncIterator[bytes]:
        try:
            sent = 0
            while count is None or sent < count:
                yield chunk
                seen.sent = sent = sent + 1
                await anyio.sleep(0.05 if count is None else 0)
        finally:
            seen.ended.set()

    async def reply(request: Request) -> Response:
        seen.headers.append(dict(request.headers))
        if how == "drip":  # its headers, then a byte now and then, for ever
            return StreamingResponse(body(b" ", None), media_type="application/json")
        if how == "retry-after":  # a wait the SDK honours (up to two minutes)
            error = {"message": "slow down", "type": "rate_limit", "param": None, "code": None}
            return JSONResponse({"error": error}, 429, headers={"retry-after": "100"})
        if how == "endless":
            return StreamingResponse(body(b"x" * CHUNK, SENT_BOUND // CHUNK), media_type="application/json")
        assert how == "gzip"  # small on the wire, four bounds once unpacked
        packed = gzip.compress(b'{"content": "' + b"z" * SENT_BOUND + b'"}', compresslevel=1)
        return Response(packed, media_type="application/json", headers={"content-encoding": "gzip"})

    routes = [Route(p, reply, methods=["POST"]) for p in ("/v1/chat/completions", "/v1/messages")]
    return Starlette(routes=routes), seen


def model_of(provider: str, base: str, **extra: object) -> dict[str, object]:
    if provider == "openai":
        return openai_model(base, **extra)
    return {"provider": provider, "model": "claude-test", "base_url": base, "api_key": SECRET, **extra}


@pytest.mark.parametrize("how", ["drip", "retry-after"])
async def test_a_model_call_that_does_not_end_ends_the_run_at_its_deadline(how: str) -> None:
    # The SDK's timeout bounds each read: a byte every 50 ms held the run for ever; and a
    # Retry-After of 100 s was waited out though agent.model.timeout was 0.5 s.
    app, seen = hostile(how)
    async with (
        serving(app) as base,
        gateway_with_model(openai_model(base, timeout=0.5, max_retries=1)) as (gw, math),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "What is 2 + 3?")
        assert result.is_error
        assert text(result) == (
            "ask_agent failed: the model did not answer within 1s "
            "(agent.model.timeout for each of 1 + agent.model.max_retries attempts)"
        )
        if how == "drip":
            with anyio.fail_after(5):  # the endpoint's reply was let go of
                await seen.ended.wait()
    assert len(seen.headers) == 1  # no retry past the deadline
    assert math.calls == []


async def test_a_model_call_whose_first_attempt_times_out_is_answered_by_the_sdks_retry() -> None:
    # agent.model.timeout bounds each attempt, and the call as a whole has one for each of
    # 1 + max_retries: the first attempt hangs past its 3 s, the SDK's retry (about 0.5 s
    # later) is answered, 5 s inside the call's 9. With one attempt's time for the whole call,
    # the retry was cut off and the run failed.
    app, api = openai_api([Turn(text="It is 5.")])
    attempts: list[int] = []

    async def first_hangs(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            attempts.append(1)
            if len(attempts) == 1:  # never answered: held until the client gives up on it
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
        await app(scope, receive, send)

    async with (
        serving(first_hangs) as base,
        gateway_with_model(openai_model(base, timeout=3, max_retries=2)) as (gw, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "What is 2 + 3?")
    assert not result.is_error, text(result)
    assert len(attempts) == 2
    assert len(api.requests) == 1  # the retry's


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_model_reply_past_its_byte_bound_is_let_go_of_as_it_arrives(provider: str) -> None:
    # 300 MB of reply were read whole before the run's bound on a reply was checked (1.5 GB of
    # the gateway's memory); an endpoint streaming without end took it to 4.5 GB in a minute.
    app, seen = hostile("endless")
    async with (
        serving(app) as base,
        gateway_with_model(model_of(provider, base, max_retries=0)) as (gw, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Hi")
        with anyio.fail_after(5):
            await seen.ended.wait()
    assert result.is_error
    assert text(result) == (
        f"ask_agent failed: the model call failed: the model's endpoint answered more than "
        f"{MAX_REPLY_BYTES:,} bytes; a run reads at most {MAX_REPLY_BYTES:,} of one reply"
    )
    assert seen.sent * CHUNK < SENT_BOUND // 2, seen.sent  # let go of early, not read to its end


async def test_a_compressed_model_reply_is_refused_unpacked() -> None:
    # Asked for nothing compressed; before, a gzip reply of 1 MB unpacked to 1 GB (4.2 GB of
    # memory, other clients stalled for seconds).
    app, seen = hostile("gzip")
    async with (
        serving(app) as base,
        gateway_with_model(openai_model(base, max_retries=0)) as (gw, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Hi")
    assert [h["accept-encoding"] for h in seen.headers] == ["identity"]
    assert result.is_error
    assert text(result) == (
        "ask_agent failed: the model call failed: the model's endpoint answered gzip-compressed "
        "though asked not to; refused, as its size is unknown until unpacked"
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_model_endpoint_that_cannot_be_reached_is_not_named_to_the_client(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Which host serves the agent's model is the operator's (as upstream hosts are, shown to
    # admin clients only): a failed run tells its client the kind of failure, the log the
    # rest. anthropic 2.17's APIConnectionError reads "Connection to 127.0.0.1:PORT failed:
    # [Errno 111] Connect call failed ('127.0.0.1', PORT)" where 2.12's read "Connection
    # error.", and the SDK's text went on to every ask_agent caller.
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    async with (
        gateway_with_model(model_of(provider, base, max_retries=0)) as (gw, _),
        Client(gw.url, mode="legacy") as client,
    ):
        result = await ask(client, "Hi")
    assert result.is_error
    assert text(result).startswith("ask_agent failed: the model call failed: ")
    wrapper = {"openai": "OpenAIConnectionError", "anthropic": "AnthropicConnectionError"}[provider]
    assert text(result) == (
        f"ask_agent failed: the model call failed: {wrapper}: the model's endpoint could not be "
        "reached (ConnectionRefusedError)"
    )
    assert f"agent: the model call failed: {wrapper}: " in caplog.text  # the operator's
    if provider == "anthropic":
        assert f"127.0.0.1:{port}" in caplog.text
