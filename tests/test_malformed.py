"""What is wrong with a stdio client's line (``downstream.malformed``): what is answered, to
which id, and what passes untouched."""

from __future__ import annotations

import json

import pytest

from agent_gateway.downstream.malformed import TOO_DEEP, malformed

VALID = [
    '{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n',
    '{"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "x", "arguments": {}}}',
    '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
    '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3, "id": 4}}',
    '{"jsonrpc": "2.0", "id": 0, "result": {"role": "assistant", "model": "m"}}',  # a sampling answer
    '{"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error"}}',
    '{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "NaN", "arguments": {"t": "Infinity"}}}',
]


@pytest.mark.parametrize("line", VALID)
def test_a_valid_request_notification_or_answer_passes(line: str) -> None:
    assert malformed(line) is None


REFUSED = [  # (line, the id answered, the code, the reason's start)
    # Python's parser and the SDK's take NaN and Infinity; the value reached the upstream as null.
    (
        '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "x", "arguments": {"v": NaN}}}',
        8,
        -32700,
        "the message holds NaN or Infinity, which JSON does not have",
    ),
    (
        '{"jsonrpc": "2.0", "method": "notifications/x", "params": {"v": -Infinity}}',
        None,
        -32700,
        "the message holds NaN",
    ),
    ('{"jsonrpc": "2.0", "id": 1, "method": "ping"', None, -32700, "not JSON: Expecting ',' delimiter"),
    ("[]", None, -32600, "a batch (JSON array)"),
    ('[{"jsonrpc": "2.0", "id": "b", "method": "ping"}]', "b", -32600, "a batch (JSON array)"),
    (
        '[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]',
        None,
        -32600,
        "a batch",
    ),
    ("42", None, -32600, "a message must be a JSON object, not a number"),
    ('{"jsonrpc": "2.0", "id": 3, "method": "x", "params": [1]}', 3, -32600, "params must be an object"),
    ('{"jsonrpc": "2.0", "method": "notifications/x", "params": "p"}', None, -32600, "params must be"),
    ('{"id": 4, "method": "ping"}', 4, -32600, '"jsonrpc" must be "2.0", not null'),
    ('{"jsonrpc": "2.0", "id": 5}', 5, -32600, "a request needs a method (a string), not null"),
    ('{"jsonrpc": "2.0", "id": true, "method": "ping"}', None, -32600, "a request id must be a string or"),
    ('{"jsonrpc": "2.0", "id": [6], "method": "ping"}', None, -32600, "a request id must be a string or"),
    (
        '{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"x": ' + "[" * 300 + "]" * 300 + "}}",
        7,
        -32600,
        TOO_DEEP,
    ),
    (
        '{"jsonrpc": "2.0", "id": "d", "method": "ping", "params": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "d",
        -32600,
        TOO_DEEP,
    ),
]


@pytest.mark.parametrize(("line", "to", "code", "reason"), REFUSED)
def test_a_malformed_line_is_answered_to_its_id_when_it_has_a_usable_one(
    line: str, to: object, code: int, reason: str
) -> None:
    found = malformed(line)
    assert found is not None
    assert found.answer is not None
    assert (found.answer.id, found.answer.error.code) == (to, code)
    assert found.answer.error.message == found.reason
    assert found.reason.startswith(reason)


def test_a_line_nested_past_128_levels_is_refused_as_an_http_body_is() -> None:
    # The SDK's own reader stops at 200 levels: from 129 to 199 it was passed on, where an
    # HTTP body is refused (and past 255 with the envelope, the SDK's models fail to write it).
    deep = "[" * 150 + "]" * 150
    request = malformed('{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"x": ' + deep + "}}")
    answer = malformed('{"jsonrpc": "2.0", "id": 9, "result": {"x": ' + deep + "}}")
    assert request is not None
    assert request.answer is not None
    assert (request.answer.id, request.answer.error.code, request.reason) == (8, -32600, TOO_DEEP)
    assert answer is not None
    assert answer.answer is None  # an answer of the client's is not answered
    assert answer.reason.endswith(TOO_DEEP)


def test_a_malformed_answer_from_the_client_is_not_answered_and_its_reason_is_bounded() -> None:
    found = malformed(json.dumps({"jsonrpc": "2.0", "id": "x" * 10_000, "result": "text"}))
    assert found is not None
    assert found.answer is None
    assert found.reason.endswith("is malformed: result: Input should be an object")
    assert len(found.reason) < 200


def test_an_answer_from_the_client_holding_nan_is_not_answered() -> None:
    found = malformed('{"jsonrpc": "2.0", "id": 3, "result": {"role": "assistant", "v": NaN}}')
    assert found is not None
    assert found.answer is None
    assert found.reason == "the message holds NaN or Infinity, which JSON does not have"
