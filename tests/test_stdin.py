"""The stdio client's request lines (``downstream.stdin``), read from a real pipe."""

from __future__ import annotations

import os

import anyio
import pytest

from agent_gateway.downstream.stdin import StdinLines


async def test_lines_come_in_order_and_one_over_the_limit_is_dropped_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read, write = os.pipe()
    os.write(write, b'{"a": 1}\n' + b"x" * 5_000 + b"\n" + b'{"b": 2}\n{"c": "\xc3\xa9"}')
    os.close(write)
    try:
        with anyio.fail_after(10):
            async with StdinLines(1_000, fd=read) as lines:
                got = [line async for line in lines]
    finally:
        os.close(read)
    assert got == ['{"a": 1}\n', '{"b": 2}\n', '{"c": "é"}']  # the last line unended, at end of input
    assert "a request line of 5001 bytes is over server.max_body_bytes (1000): dropped" in caplog.text


async def test_closing_the_lines_does_not_wait_for_a_writer_that_never_writes() -> None:
    read, write = os.pipe()  # the write end stays open, silent: a client that keeps stdin open
    try:
        with anyio.fail_after(10):
            async with StdinLines(1_000, fd=read) as lines:
                with anyio.move_on_after(0.2):
                    await lines.__anext__()
    finally:
        os.close(write)
        os.close(read)
