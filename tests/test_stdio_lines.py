"""The stdio upstream's line reader: lines in any chunking, and the size limit."""

from __future__ import annotations

from agent_gateway.upstreams.stdio import Lines, Oversized


def fed(lines: Lines, *chunks: bytes) -> list[bytes | Oversized]:
    return [line for chunk in chunks for line in lines.feed(chunk)]


def test_lines_come_out_whole_however_they_are_chunked() -> None:
    data = b'{"a": 1}\n\n{"b": "' + b"x" * 5000 + b'"}\n{"c": 3}\n'
    whole = fed(Lines(10_000), data)
    for size in (1, 7, 64, 4096):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert fed(Lines(10_000), *chunks) == whole
    assert [len(line) for line in whole if isinstance(line, bytes)] == [8, 5009, 8]


def test_a_line_over_the_limit_is_reported_with_its_head_and_size_not_kept() -> None:
    lines = Lines(100)
    big = b'{"jsonrpc": "2.0", "id": 7, "result": "' + b"y" * 1000 + b'"}'
    out = fed(lines, big[:50], big[50:600], big[600:] + b'\n{"id": 8}\n')
    assert len(out) == 2
    assert isinstance(out[0], Oversized)
    assert out[0].size == len(big)
    assert out[0].head.startswith(b'{"jsonrpc": "2.0", "id": 7')
    assert out[1] == b'{"id": 8}'
