"""The stdio upstream's line reader: lines in any chunking, the size limit, and the answer
an oversized response turns into."""

from __future__ import annotations

import tracemalloc

import mcp_types as types

from agent_gateway.in_flight import IN_FLIGHT, bounded
from agent_gateway.upstreams.stdio import Lines, Oversized, refusal


def fed(lines: Lines, *chunks: bytes) -> list[bytes | Oversized]:
    """The lines ``chunks`` make, parsed (as the reader does after each chunk)."""
    out = []
    for chunk in chunks:
        out += lines.feed(chunk)
        lines.parsed()
    return out


def test_lines_come_out_whole_however_they_are_chunked() -> None:
    data = b'{"a": 1}\n\n{"b": "' + b"x" * 5000 + b'"}\n{"c": 3}\n'
    whole = fed(Lines(10_000), data)
    for size in (1, 7, 64, 4096):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert fed(Lines(10_000), *chunks) == whole
    assert [len(line) for line in whole if isinstance(line, bytes)] == [8, 5009, 8]


def test_a_line_at_the_limit_passes_and_one_byte_more_does_not() -> None:
    assert fed(Lines(10), b"0123456789\n") == [b"0123456789"]
    [over] = fed(Lines(10), b"0123456789A\n")
    assert isinstance(over, Oversized)
    assert over.size == 11


def test_a_line_over_the_limit_is_not_held_while_it_arrives() -> None:
    # 64 MiB in fresh 1 MiB chunks, no newline yet: a reader that held them would have them
    # all in memory now; this one keeps the first and last bytes and a count.
    tracemalloc.start()
    try:
        with Lines(2**20) as lines:
            for _ in range(64):
                assert lines.feed(b"x" * 2**20) == []
            _, peak = tracemalloc.get_traced_memory()
            [over] = lines.feed(b"\n")
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MiB held"
    assert isinstance(over, Oversized)
    assert over.size == 64 * 2**20


def oversized(line: bytes, limit: int = 100, step: int = 333) -> Oversized:
    [out] = fed(Lines(limit), *[line[i : i + step] for i in range(0, len(line), step)], b"\n")
    assert isinstance(out, Oversized)
    assert out.size == len(line)
    return out


def error_id(message: object) -> object:
    assert not isinstance(message, Exception), message
    answer = message.message  # type: ignore[attr-defined]
    assert isinstance(answer, types.JSONRPCError)
    assert "over max_message_bytes (100)" in answer.error.message
    return answer.id


def test_an_oversized_response_fails_the_call_it_answers_whichever_sdk_wrote_it() -> None:
    body = b'"' + b"y" * 2000 + b'"'
    python_order = b'{"jsonrpc": "2.0", "id": 7, "result": {"id": 99, "text": ' + body + b"}}"
    typescript_order = b'{"result": {"id": 99, "text": ' + body + b'}, "jsonrpc": "2.0", "id": "r-8"}'
    assert error_id(refusal(oversized(python_order), 100, "up")) == 7
    assert error_id(refusal(oversized(typescript_order), 100, "up")) == "r-8"


def test_an_oversized_message_that_is_no_response_is_only_reported() -> None:
    request = (
        b'{"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": "' + b"z" * 2000 + b'"}'
    )
    nested_only = b'{"jsonrpc": "2.0", "method": "x", "params": {"id": 5, "v": "' + b"z" * 2000 + b'"}}'
    bad_escape = b'{"jsonrpc": "2.0", "id": "a\\q", "result": "' + b"z" * 2000 + b'"}'
    for line in (request, nested_only, bad_escape):
        assert isinstance(refusal(oversized(line), 100, "up"), ValueError)


async def test_a_line_past_the_bound_of_bytes_in_flight_fails_its_call_and_holds_nothing() -> None:
    line = b'{"jsonrpc": "2.0", "id": 7, "result": {"text": "' + b"x" * (3 * 2**20) + b'"}}'
    small = b'{"jsonrpc": "2.0", "id": 8, "result": {}}'
    before = IN_FLIGHT.held  # the tests above feed lines they never parse
    async with bounded(2**20):
        with Lines(2**31) as lines:
            chunks = [line[i : i + 2**16] for i in range(0, len(line), 2**16)]
            over, fitting = fed(lines, *chunks, b"\n", small, b"\n")
            assert IN_FLIGHT.held == before
            fed(lines, b'{"unfinished": "')  # held until the stream ends
            assert IN_FLIGHT.held > before
        assert IN_FLIGHT.held == before
        assert isinstance(over, Oversized)
        assert over.busy
        answer = refusal(over, 2**31, "up")
    assert not isinstance(answer, Exception)
    assert isinstance(answer.message, types.JSONRPCError)
    assert answer.message.id == 7
    assert "the gateway holds its bound of 1 MiB of answers in flight" in answer.message.error.message
    assert fitting == small
