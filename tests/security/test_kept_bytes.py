"""What the gateway keeps of a client is bounded, not only what it reads: an ``initialize``'s
params are kept for the session's life and a request's ``_meta`` envelope for the request's
(a listen stream's for hours). Parsed, a 909 KB initialize of small values held 22 MB, so one
address's 100 sessions took 2.2 GB, and 100 listen streams 2.7 GB; a request id of 3.9 MB
was kept whole in each of its spans. Each is now refused at admission, and costs no one else
anything. Found by a helper's attack (stop 51)."""

from __future__ import annotations

import json

import httpx
import pytest

from agent_gateway.body_shape import MAX_ID_LENGTH, MAX_INITIALIZE_VALUES, MAX_KEPT_BYTES
from tests.replicas.test_store import ACCEPT, opened
from tests.security.test_unrepresentable import HEADERS, VERSION, modern_call, recorder
from tests.support import running_gateway, serving_upstream

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602


def initialize(experimental_bytes: int) -> dict[str, object]:
    """An ``initialize`` whose capabilities hold a string of ``experimental_bytes``."""
    capabilities = {"experimental": {"x": {"note": "v" * experimental_bytes}}}
    info = {
        "protocolVersion": VERSION,
        "capabilities": capabilities,
        "clientInfo": {"name": "c", "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": info}


async def test_an_initialize_holding_more_than_the_gateway_keeps_is_refused_and_one_within_served() -> None:
    async with running_gateway({}) as gw, httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(gw.url, json=initialize(2 * MAX_KEPT_BYTES), headers=HEADERS)
        served = await http.post(gw.url, json=initialize(MAX_KEPT_BYTES // 2), headers=HEADERS)
    assert refused.json()["error"]["code"] == INVALID_REQUEST, refused.text
    assert "initialize params of" in refused.json()["error"]["message"]
    assert "mcp-session-id" not in refused.headers  # no session opened
    assert served.status_code == 200, served.text
    assert "mcp-session-id" in served.headers


@pytest.mark.parametrize("meta_bytes", [2 * MAX_KEPT_BYTES, 0])
async def test_a_modern_requests_envelope_is_bounded_and_its_arguments_are_not(meta_bytes: int) -> None:
    received: list[object] = []
    big = "y" * (2 * MAX_KEPT_BYTES)  # arguments are passed on, not kept: large ones are served
    async with (
        serving_upstream(recorder(received)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        body, headers = modern_call("rec__keep", json.dumps({"x": big}))
        if meta_bytes:
            document = json.loads(body)
            document["params"]["_meta"]["io.example/padding"] = "z" * meta_bytes
            body = json.dumps(document).encode()
        answer = (await http.post(gw.url, content=body, headers=headers)).json()
    if meta_bytes:
        assert answer["error"]["code"] == INVALID_REQUEST, answer
        assert "_meta of" in answer["error"]["message"]
        assert answer["id"] == 3  # its own id (before: null, as for an id it cannot tell)
        assert received == []
    else:
        assert answer["result"]["content"][0]["text"] == "kept", answer
        assert received == [big]


@pytest.mark.parametrize("kind", ["string", "integer"])
async def test_a_request_id_longer_than_the_limit_is_refused_and_reaches_no_upstream(kind: str) -> None:
    # An integer's digits count as a string's characters: an id of 4,300 digits (the most
    # Python's parser reads) was served, and carried by its span, records and answer.
    received: list[object] = []
    too_long, longest = (
        ("i" * (MAX_ID_LENGTH + 1), "i" * MAX_ID_LENGTH)
        if kind == "string"
        else (-(10**MAX_ID_LENGTH), 10**MAX_ID_LENGTH - 1)
    )
    async with (
        serving_upstream(recorder(received)) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}}) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        answers = []
        for request_id in (too_long, longest):
            body, headers = modern_call("rec__keep", '{"x": 1}')
            document = json.loads(body) | {"id": request_id}
            answers.append((await http.post(gw.url, json=document, headers=headers)).json())
    refused, served = answers
    assert refused["error"]["code"] == INVALID_REQUEST, refused
    assert "request id of" in refused["error"]["message"]
    assert refused["id"] is None  # an id it refuses is not repeated back
    assert served["id"] == longest
    assert received == [1]


async def test_a_listen_streams_params_and_a_long_method_name_are_bounded() -> None:
    # A listen stream holds its whole request for hours: a 909 KB payload beside a small
    # _meta took 25 MB a stream, 100 streams 2.7 GB. A 3.9 MB method name named a span and
    # came back in the unknown method's error. Found by a helper's attack (stop 51).
    async with running_gateway({}) as gw, httpx.AsyncClient(timeout=10) as http:
        body, headers = modern_call("x", "{}")
        listen = json.loads(body) | {"method": "subscriptions/listen"}
        listen["params"] = {"_meta": listen["params"]["_meta"], "junk": "j" * (2 * MAX_KEPT_BYTES)}
        refused_listen = (await http.post(gw.url, json=listen, headers=headers)).json()
        long_method = json.loads(body) | {"method": "m" * 129}
        refused_method = (await http.post(gw.url, json=long_method, headers=headers)).json()
    assert "subscriptions/listen params of" in refused_listen["error"]["message"], refused_listen
    assert refused_method["error"]["code"] == INVALID_REQUEST
    assert "a method name of 129 characters" in refused_method["error"]["message"]


async def test_an_initialize_of_many_small_values_is_refused_whatever_its_size() -> None:
    # 64 KiB of empty lists parse to 2.35 MB, kept for each session of each address (a
    # helper's re-run of its attack, stop 51): the values are counted too.
    many = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize(0)["params"]}
    many["params"]["capabilities"] = {"experimental": {"x": [[] for _ in range(MAX_INITIALIZE_VALUES + 10)]}}
    fewer = json.loads(json.dumps(many))
    fewer["params"]["capabilities"]["experimental"]["x"] = list(range(MAX_INITIALIZE_VALUES - 50))
    async with running_gateway({}) as gw, httpx.AsyncClient(timeout=10) as http:
        assert len(json.dumps(many)) < MAX_KEPT_BYTES
        refused = await http.post(gw.url, json=many, headers=HEADERS)
        served = await http.post(gw.url, json=fewer, headers=HEADERS)
    assert refused.json()["error"]["code"] == INVALID_REQUEST, refused.text
    assert f"the gateway keeps at most {MAX_INITIALIZE_VALUES}" in refused.json()["error"]["message"]
    assert served.status_code == 200, served.text
    assert "mcp-session-id" in served.headers


@pytest.mark.parametrize(
    "method", ["prompts/list", "resources/list", "resources/templates/list", "tools/list"]
)
async def test_a_cursor_longer_than_the_gateways_own_is_refused_without_being_sent_back(method: str) -> None:
    # FastMCP's lists answered an unreadable cursor with the whole of it: 3.5 MB back for
    # each 3.5 MB sent (four clients took the gateway's CPU). A real one is read, as ever.
    async with (
        serving_upstream(recorder([])) as url,
        running_gateway({"upstreams": {"rec": {"url": url}}, "server": {"page_size": 1}}) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        headers = {**await opened(http, gw.url), **ACCEPT}
        ask = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"cursor": "A" * 100_000}}
        refused = await http.post(gw.url, json=ask, headers=headers)
        first = await http.post(gw.url, json={**ask, "params": {}}, headers=headers)
    assert refused.json()["error"]["code"] == INVALID_PARAMS, refused.text
    assert "a cursor of 100000 characters" in refused.json()["error"]["message"]  # refused at admission
    assert len(refused.content) < 1_000
    assert "result" in first.json(), first.text
