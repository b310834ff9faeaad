"""Dense retrieval through an OpenAI-compatible /embeddings endpoint the test runs: a request
that shares no word with the right tool finds it, and a failing endpoint costs only the fusion."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastmcp import FastMCP
from mcp import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent_gateway.search.tools import SEARCH_TOOLS
from tests.support import RunningGateway, running_gateway, serving, serving_upstream
from tests.test_search_mode import found

# A toy embedding model: each word stands for one of three concepts.
CONCEPTS = {
    **dict.fromkeys(["plant", "saplings", "orchard", "oaks", "ground", "trees", "seedlings"], 0),
    **dict.fromkeys(["irrigate", "water", "flower", "beds", "garden", "hose", "sprinkle"], 1),
    **dict.fromkeys(["invoice", "money", "customer", "bill", "cash"], 2),
}
KEY = "emb-key-0123456789"


@dataclass
class Endpoint:
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    failing: bool = False
    not_finite: bool = False
    gate: anyio.Event | None = None
    """Set: each request after the catalog's first batch waits for it."""


def vector(text: str) -> list[float]:
    counts = [0.0, 0.0, 0.0, 0.01]
    for word in text.lower().replace(".", " ").replace(":", " ").split():
        if (concept := CONCEPTS.get(word)) is not None:
            counts[concept] += 1.0
    return counts


def embeddings_app(endpoint: Endpoint) -> Starlette:
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        endpoint.requests.append(body)
        endpoint.authorizations.append(request.headers.get("authorization", ""))
        if endpoint.gate is not None:
            await endpoint.gate.wait()
        if endpoint.failing:
            return JSONResponse({"error": {"message": "overloaded"}}, 503)
        data = [
            {"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(body["input"])
        ]
        if endpoint.not_finite:
            return Response(json.dumps({"object": "list", "data": data}).replace("0.01", "NaN"))
        return JSONResponse({"object": "list", "data": data})

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


def garden_server() -> FastMCP:
    server = FastMCP("garden")
    server.tool(lambda: "planted", name="plant_trees", description="Plant saplings in the orchard.")
    server.tool(lambda: "watered", name="water_garden", description="Irrigate the flower beds.")
    server.tool(lambda: "billed", name="send_invoice", description="Bill a customer.")
    return server


@asynccontextmanager
async def dense_gateway(
    endpoint: Endpoint,
    auth: dict[str, Any] | None = None,
    embeddings: dict[str, str] | None = None,
    upstream: dict[str, Any] | None = None,
) -> AsyncIterator[RunningGateway]:
    async with serving(embeddings_app(endpoint)) as base, serving_upstream(garden_server()) as url:
        search = {
            "mode": "on",
            "embeddings": {
                "base_url": f"{base}/v1",
                "model": "toy-embed",
                "api_key": KEY,
                **(embeddings or {}),
            },
        }
        garden = {"url": url} | (upstream or {})
        config = {"upstreams": {"garden": garden}, "search": search, "auth": auth or {}}
        async with running_gateway(config) as gw:
            with anyio.fail_after(10):
                while not gw.gateway.search.embedded(3):
                    await anyio.sleep(0.01)
            yield gw


async def test_a_request_sharing_no_word_with_the_tool_is_found_by_its_meaning() -> None:
    endpoint = Endpoint()
    async with dense_gateway(endpoint) as gw, Client(gw.url) as client:
        result = await client.call_tool(SEARCH_TOOLS, {"query": "put some young oaks in the ground"})
        hits = found(result)
        assert hits[0] == "garden__plant_trees"
        assert result.structured_content["tools"][0]["score"] >= 0.25  # type: ignore[index]
    # The catalog's texts in one batch, then the query; the configured model and key each time.
    assert len(endpoint.requests[0]["input"]) == 3
    assert endpoint.requests[-1]["input"] == ["put some young oaks in the ground"]
    assert {r["model"] for r in endpoint.requests} == {"toy-embed"}
    assert set(endpoint.authorizations) == {f"Bearer {KEY}"}


async def test_an_upstream_weighted_zero_is_not_found_by_meaning_either() -> None:
    async with dense_gateway(Endpoint(), upstream={"search_weight": 0}) as gw, Client(gw.url) as client:
        result = await client.call_tool(SEARCH_TOOLS, {"query": "put some young oaks in the ground"})
    assert found(result) == []


async def test_the_configured_prefixes_mark_requests_and_tool_texts_for_models_trained_with_them() -> None:
    endpoint = Endpoint()
    prefixes = {"query_prefix": "query: ", "document_prefix": "passage: "}
    async with dense_gateway(endpoint, embeddings=prefixes) as gw, Client(gw.url) as client:
        result = await client.call_tool(SEARCH_TOOLS, {"query": "put some young oaks in the ground"})
    assert found(result)[0] == "garden__plant_trees"
    catalog, query = endpoint.requests[0]["input"], endpoint.requests[-1]["input"]
    assert len(catalog) == 3
    assert all(t.startswith("passage: ") for t in catalog)
    assert query == ["query: put some young oaks in the ground"]


async def test_a_failing_embeddings_endpoint_leaves_lexical_search_working() -> None:
    endpoint = Endpoint()
    async with dense_gateway(endpoint) as gw, Client(gw.url) as client:
        endpoint.failing = True
        result = await client.call_tool(SEARCH_TOOLS, {"query": "irrigate the flower beds"})
        assert not result.is_error
        assert found(result)[0] == "garden__water_garden"
        # A meaning-only request now finds nothing confident, and says so, rather than failing.
        vague = await client.call_tool(SEARCH_TOOLS, {"query": "put some young oaks in the ground"})
        assert not vague.is_error
        assert all(t["score"] < 0.25 for t in vague.structured_content["tools"])  # type: ignore[index]


async def test_the_clearer_of_the_words_and_the_meaning_wins_where_ranks_alone_would_tie() -> None:
    # In both requests the words rank watering first and planting second, and the meaning the
    # other way round: by ranks alone the two requests are the same, and end the same. By how
    # far each tool stands out: three rare words against one outweigh a meaning leaning to
    # planting (four of its words to three); one word against none does not outweigh a
    # meaning that is nearly all planting.
    endpoint = Endpoint()
    async with dense_gateway(endpoint) as gw, Client(gw.url) as client:
        by_words = await client.call_tool(
            SEARCH_TOOLS, {"query": "irrigate flower beds orchard oaks seedlings ground"}
        )
        by_meaning = await client.call_tool(SEARCH_TOOLS, {"query": "water orchard oaks seedlings ground"})
    assert found(by_words)[:2] == ["garden__water_garden", "garden__plant_trees"]
    assert found(by_meaning)[:2] == ["garden__plant_trees", "garden__water_garden"]


async def test_an_endpoint_answering_a_vector_that_is_not_finite_leaves_lexical_search_working() -> None:
    endpoint = Endpoint()
    async with dense_gateway(endpoint) as gw, Client(gw.url) as client:
        endpoint.not_finite = True  # NaN where the request's vector had a number
        result = await client.call_tool(SEARCH_TOOLS, {"query": "irrigate the flower beds"})
    assert not result.is_error
    assert found(result) == ["garden__water_garden"]  # the words' match alone, not the meaning's
    assert all(math.isfinite(t["score"]) for t in result.structured_content["tools"])  # type: ignore[index]


async def test_a_search_in_flight_counts_against_the_clients_max_concurrency() -> None:
    # A search is a call in flight: over the client's max_concurrency it is refused at once,
    # as a tool call is, not queued with all the others at the index (a helper's attack sent
    # hundreds at once, and every other client's searches waited behind them).
    endpoint = Endpoint()
    single = {"mode": "none", "policies": {"default": {"max_concurrency": 1}}}
    async with dense_gateway(endpoint, single) as gw, Client(gw.url) as client:
        endpoint.gate, seen = anyio.Event(), len(endpoint.requests)
        first: list[Any] = []
        busy: Any = None
        async with anyio.create_task_group() as tg:

            async def search() -> None:
                first.append(await client.call_tool(SEARCH_TOOLS, {"query": "water the garden"}))

            tg.start_soon(search)
            with anyio.fail_after(10):  # the first search is at the endpoint, embedding its query
                while len(endpoint.requests) == seen:
                    await anyio.sleep(0.01)
            busy = await client.call_tool(SEARCH_TOOLS, {"query": "plant trees"})
            endpoint.gate.set()
    assert busy.is_error
    assert busy.content[0].text == "client limit: 1 calls already in flight, the limit (max_concurrency) is 1"  # type: ignore[union-attr]
    assert found(first[0])[0] == "garden__water_garden"
