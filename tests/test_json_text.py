"""``json_text`` reads a client's JSON text without parsing it: how many values it holds and
how deep it nests, from its punctuation outside strings. Hypothesis draws JSON values whose
strings are full of what those reads must step over (quotes, backslashes, brackets, commas)
and checks both reads against the value itself."""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent_gateway.json_text import json_values, nests_deeper, value_nests_deeper

tricky_text = st.text(
    alphabet=st.sampled_from(['"', "\\", "[", "]", "{", "}", ",", ":", "a", "é", " "]), max_size=8
)
values = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4),
    max_leaves=24,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(item) for item in value), default=0)  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, dict):
        return 1 + max((depth(item) for item in value.values()), default=0)  # pyright: ignore[reportUnknownVariableType]
    return 0


def value_marks(value: Any) -> int:
    """Opening braces, brackets and commas outside strings: each container one, each item
    after a container's first one."""
    if isinstance(value, list | dict):
        items = list(value.values() if isinstance(value, dict) else value)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        return 1 + max(len(items) - 1, 0) + sum(value_marks(item) for item in items)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
    return 0


def texts(value: Any) -> list[bytes]:
    return [json.dumps(value).encode(), json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()]


@given(value=values, bound=st.integers(min_value=0, max_value=6))
def test_depth_is_read_from_brackets_outside_strings(value: Any, bound: int) -> None:
    for text in texts(value):
        assert nests_deeper(text, bound) == (depth(value) > bound), text
        assert nests_deeper(text.decode(), bound) == (depth(value) > bound), text


runs = st.lists(
    st.tuples(st.sampled_from("[{"), st.integers(0, 3), st.sampled_from("]}"), st.integers(0, 12))
)
brackets = st.text(alphabet="[]{}", max_size=40) | runs.map(
    lambda rs: "".join(o * a + c * b for o, a, c, b in rs)
)
"""Any brackets, and runs of them with the closing ones mostly outnumbering the opening ones."""


@given(text=brackets, bound=st.integers(min_value=0, max_value=6))
def test_depth_of_any_brackets_is_their_deepest_running_level(text: str, bound: int) -> None:
    # Unbalanced too (a body's first check comes before its parse): the running level, walked.
    deepest = max(accumulate(1 if c in "[{" else -1 for c in text), default=0)
    assert nests_deeper(text, bound) == (deepest > bound), text
    assert nests_deeper(text.encode(), bound) == (deepest > bound), text


@given(
    value=values, bound=st.integers(min_value=0, max_value=6), walked=st.integers(min_value=0, max_value=30)
)
def test_depth_is_read_from_the_parsed_value_until_too_many_values(
    value: Any, bound: int, walked: int
) -> None:
    read = value_nests_deeper(value, bound, walked)
    assert read in (None, depth(value) > bound)
    assert value_nests_deeper(value, bound, 10**6) == (depth(value) > bound)


@given(value=values)
def test_values_are_counted_from_punctuation_outside_strings(value: Any) -> None:
    for text in texts(value):
        # A bound of 0 has every text with punctuation in it counted without its strings.
        assert json_values(text, 0) == value_marks(value), text
