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
    check = SchemaCheck(SCHEMA)
    assert check._quick is not None  # pyright: ignore[reportPrivateUsage]  # the quick check is there to say so
    assert check.first_error(value) is None


@pytest.mark.parametrize(
    "draft",
    [
        "https://json-schema.org/draft-04/schema#",  # not a URI jsonschema knows: it reads 2020-12
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2020-12/schema",
    ],
)
def test_the_quick_check_reads_the_draft_jsonschema_reads(draft: str) -> None:
    # jsonschema-rs alone reads the https draft-04 URI as draft 4, where "const" does not
    # exist: its "it holds" would pass what jsonschema refuses.
    check = SchemaCheck({"$schema": draft, "properties": {"mode": {"const": "safe"}}})
    error = check.first_error({"mode": "destroy"})
    if "draft-04" in draft and draft.startswith("http:"):
        assert error is None  # draft 4 has no "const": both read it so
    else:
        assert error is not None
        assert error.message == "'safe' was expected"


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
    ids=["required", "minimum", "pattern", "additional", "format"],
)
def test_a_value_that_fails_gets_jsonschemas_words(value: dict[str, Any], message: str) -> None:
    error = SchemaCheck(SCHEMA).first_error(value)
    assert error is not None
    assert message in error.message


def test_a_broken_schema_leaves_every_value_to_the_upstream() -> None:
    check = SchemaCheck({"type": "no such type"})
    assert check.first_error(42) is None


# What a pattern costs is shown by tests/security/test_tool_schemas.py (a gateway of its own,
# bounded): here, that errors on patterns are worded as jsonschema words them.


def test_a_pattern_failed_is_worded_as_jsonschema_words_it() -> None:
    error = SchemaCheck({"type": "string", "pattern": "^(a+)+$"}).first_error("aaaaa!")
    assert error is not None
    assert error.message == "'aaaaa!' does not match '^(a+)+$'"


def test_a_pattern_only_python_reads_is_still_checked() -> None:
    check = SchemaCheck({"type": "string", "pattern": "^a{,3}$"})  # jsonschema-rs cannot compile it
    assert check.first_error("aa") is None
    error = check.first_error("aaaa")
    assert error is not None
    assert error.message == "'aaaa' does not match '^a{,3}$'"


NAMED: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "integer"}},
    "patternProperties": {"^(a+)+$": {"type": "integer"}},
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"aaaaa!": 1}, "'aaaaa!' does not match any of the regexes: '^(a+)+$'"),
        ({"aaa": "one"}, "'one' is not of type 'integer'"),
        ({"b": 1, "c": 2}, "'b', 'c' do not match any of the regexes: '^(a+)+$'"),
    ],
)
def test_property_names_failed_are_worded_as_jsonschema_words_them(
    value: dict[str, Any], message: str
) -> None:
    error = SchemaCheck(NAMED).first_error(value)
    assert error is not None
    assert message in error.message


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"b": 1}, "Additional properties are not allowed ('b' was unexpected)"),
        ({"b": 1, "c": 2}, "Additional properties are not allowed ('b', 'c' were unexpected)"),
    ],
)
def test_additional_properties_are_worded_as_jsonschema_words_them(
    extra: dict[str, Any], message: str
) -> None:
    error = SchemaCheck(
        {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    ).first_error(extra)
    assert error is not None
    assert error.message == message
