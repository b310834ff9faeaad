"""``SchemaCheck``: the compiled validator's "it holds" taken, jsonschema's words otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from agent_gateway.schema_check import SchemaCheck

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "format": "email"},
        "count": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
    },
    "required": ["email"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "value",
    [
        {"email": "ada@example.org"},
        {"email": "ada@example.org", "count": 10**30, "tags": ["x", "yz"]},
    ],
)
def test_a_value_that_holds_has_no_error(value: dict[str, Any]) -> None:
    assert SchemaCheck(SCHEMA).first_error(value) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "'email' is a required property"),
        ({"email": "ada@example.org", "count": -1}, "-1 is less than the minimum of 0"),
        ({"email": "ada@example.org", "tags": ["A"]}, "'A' does not match '^[a-z]+$'"),
        ({"email": "ada@example.org", "extra": 1}, "Additional properties are not allowed"),
        # Formats are checked by both: a quick check without them would let this through.
        ({"email": "not an address"}, "'not an address' is not a 'email'"),
    ],
)
def test_a_value_that_fails_gets_jsonschemas_words(value: dict[str, Any], message: str) -> None:
    error = SchemaCheck(SCHEMA).first_error(value)
    assert error is not None
    assert message in error.message


def test_a_broken_schema_leaves_every_value_to_the_upstream() -> None:
    check = SchemaCheck({"type": "no such type"})
    assert check.first_error(42) is None


def test_a_pattern_is_matched_in_linear_time_in_both_validators() -> None:
    # Python's re takes hours on this value; a quick check alone would still hand the
    # rejected value to jsonschema, and so to re, for its message.
    check = SchemaCheck({"type": "string", "pattern": "^(a+)+$"})
    error = check.first_error("a" * 40 + "!")
    assert error is not None
    assert error.message == "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!' does not match '^(a+)+$'"


def test_a_pattern_only_python_reads_is_still_checked() -> None:
    check = SchemaCheck({"type": "string", "pattern": "^a{,3}$"})  # jsonschema-rs cannot compile it
    assert check.first_error("aa") is None
    error = check.first_error("aaaa")
    assert error is not None
    assert error.message == "'aaaa' does not match '^a{,3}$'"
