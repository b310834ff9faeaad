"""What the gateway reads of one upstream message before the SDK sees it (``compat/mcp.decode``):
how deep it may nest, and numbers JSON does not have. Each case is a message as an upstream
writes it; the fault tests (``tests/faults/test_upstream_faults.py``) send such messages over
every transport, these pin the edges."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from agent_gateway.compat.mcp import MAX_MESSAGE_DEPTH, Unreadable, decode


def nested(levels: int) -> str:
    """``levels`` objects, one inside the other."""
    return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)


def answer(result: str) -> bytes:
    return ('{"jsonrpc":"2.0","id":1,"result":' + result + "}").encode()


def call_result(structured: str) -> bytes:
    return answer('{"content":[{"type":"text","text":"t"}],"structuredContent":' + structured + "}")


@pytest.mark.parametrize("text", [False, True])
def test_a_message_as_deep_as_the_bound_is_read_and_one_level_more_is_not(text: bool) -> None:
    # The message and its result are two levels; the structured content the rest.
    fits, deeper = call_result(nested(MAX_MESSAGE_DEPTH - 2)), call_result(nested(MAX_MESSAGE_DEPTH - 1))
    assert decode(fits.decode() if text else fits)["result"]["content"][0]["text"] == "t"
    with pytest.raises(
        Unreadable, match=f"nests deeper than the gateway reads \\({MAX_MESSAGE_DEPTH} levels\\)"
    ):
        decode(deeper.decode() if text else deeper)


def test_depth_is_read_past_many_values_too() -> None:
    # Thousands of values walked before the deep part (the last key first): past what is
    # walked, the bytes are read.
    many = '{"deep":' + nested(MAX_MESSAGE_DEPTH) + ',"many":[' + ",".join(["{}"] * 10_000) + "]}"
    with pytest.raises(Unreadable):
        decode(call_result(many))


def test_brackets_in_strings_do_not_make_a_message_deep() -> None:
    text = json.dumps([{"a": [1, {"b": "c"}]}] * 50_000) + "[" * 1_000
    message = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}})
    assert decode(message.encode())["result"]["content"][0]["text"] == text


def test_a_tool_listing_is_read_however_deep_and_nothing_else_that_names_tools() -> None:
    deep_tool = '{"name":"deep","inputSchema":' + nested(MAX_MESSAGE_DEPTH + 50) + "}"
    listing = answer('{"tools":[' + deep_tool + '],"nextCursor":"2"}')
    assert decode(listing)["result"]["tools"][0]["name"] == "deep"
    # A read's answer holding a "tools" key too is no listing.
    read = answer(
        '{"tools":[],"contents":[{"uri":"x://y","text":"t","_meta":' + nested(MAX_MESSAGE_DEPTH) + "}]}"
    )
    with pytest.raises(Unreadable):
        decode(read)


@pytest.mark.parametrize("number", ["NaN", "-Infinity", "Infinity", "1e400", "-1E999"])
def test_numbers_json_does_not_have_are_refused_with_that_reason(number: str) -> None:
    with pytest.raises(Unreadable, match="NaN, Infinity or a number past a double's range"):
        decode(call_result('{"v":' + number + "}"))


@pytest.mark.parametrize("broken", ['{"v":"NaN"', '{"v":Nope}', '{"v":1e400', "{'v': 1}"])
def test_other_broken_json_is_the_parsers_error(broken: Any) -> None:
    # Named in a string, or broken elsewhere: not the numbers' reason (nor a second parse).
    with pytest.raises(msgspec.DecodeError) as refused:
        decode(call_result(broken))
    assert not isinstance(refused.value, Unreadable)
