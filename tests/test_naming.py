"""Public names: charset, length cap, collisions."""

from __future__ import annotations

import re

import pytest

from agent_gateway.naming import (
    NameCollision,
    Origin,
    build_table,
    is_selected,
    public_name,
    upstream_name_problem,
)

CLIENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What clients and model APIs accept as a tool name (OpenAI's own pattern), written out here
rather than taken from the module, so loosening the module's rule cannot loosen the test."""


def test_public_name_joins_upstream_and_tool_with_double_underscore() -> None:
    assert public_name("everything", "get-sum") == "everything__get-sum"


def test_prefix_off_keeps_the_upstream_name() -> None:
    assert public_name("everything", "echo", prefix=False) == "echo"


def test_characters_outside_the_portable_charset_are_replaced() -> None:
    assert public_name("git", "repo.status/v2") == "git__repo_status_v2"


def test_over_long_names_are_cut_deterministically_with_a_hash() -> None:
    long = "x" * 100
    first = public_name("up", long)
    assert len(first) == 64
    assert CLIENT_NAME.match(first), first
    assert first == public_name("up", long)
    assert first != public_name("up", long + "y")


def test_names_that_sanitize_alike_but_differ_still_shorten_apart() -> None:
    assert public_name("up", "a." + "b" * 80) != public_name("up", "a_" + "b" * 80)


def test_upstream_names_are_validated() -> None:
    assert upstream_name_problem("everything") is None
    assert upstream_name_problem("has space") is not None
    assert upstream_name_problem("a__b") == "must not contain the separator '__'"
    assert upstream_name_problem("x" * 33) is not None


def test_collisions_name_both_sources() -> None:
    with pytest.raises(NameCollision) as caught:
        build_table("tool", [("x", Origin("a", "x", 1)), ("x", Origin("b", "y", 2))])
    message = str(caught.value)
    assert "'a'" in message
    assert "'b'" in message
    assert "'y'" in message


def test_include_and_exclude_globs() -> None:
    assert is_selected("read_file", ["read_*"], [])
    assert not is_selected("write_file", ["read_*"], [])
    assert not is_selected("read_secret", ["*"], ["*secret*"])
