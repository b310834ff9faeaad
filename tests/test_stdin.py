"""The stdio client's request lines (``downstream.stdin``), read from a real pipe."""

from __future__ import annotations

import json
import os

import anyio
import mcp_types as types
import pytest

from agent_gateway.downstream.stdin import StdinLines

BIG = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"x": "' + b"x" * 5_000 + b'"}}\n'
TS_STYLE = (
    b'{"method": "tools/call", "params": {"x": "' + b"y" * 5_000 + b'"}, "jsonrpc": "2.0", "id": "q"}\n'
)
"""As the TypeScript SDK writes a request: its id last."""
A = b'{"jsonrpc": "2.0", "method": "notifications/a"}'
B = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
C = '{"jsonrpc": "2.0", "method": "notifications/é"}'


async def test_lines_come_in_order_and_one_over_the_limit_is_refused_by_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read, write = os.pipe()
    refused: list[tuple[object, str]] = []
    got: list[str] = []

    async def refuse(answer: types.JSONRPCError) -> None:
        refused.append((answer.id, answer.error.message))

    async def feed() -> None:  # more than a pipe holds: written while it is read
        await anyio.to_thread.run_sync(os.write, write, A + b"\n" + BIG + B + b"\n" + TS_STYLE)
        await anyio.to_thread.run_sync(os.write, write, C.encode())
        os.close(write)

    try:
        with anyio.fail_after(10):
            async with StdinLines(1_000, 100_000, fd=read) as lines, anyio.create_task_group() as tg:
                lines.refuse = refuse
                tg.start_soon(feed)
                got += [line async for line in lines]
    finally:
        os.close(read)
    assert got == [A.decode() + "\n", B.decode() + "\n", C]  # the last line unended, at end of input
    reason = f"request of {len(BIG)} bytes is over server.max_body_bytes (1000)"
    assert refused == [
        (7, reason),
        ("q", f"request of {len(TS_STYLE)} bytes is over server.max_body_bytes (1000)"),
    ]
    assert f"stdio: a {reason}: refused" in caplog.text


async def test_closing_the_lines_does_not_wait_for_a_writer_that_never_writes() -> None:
    read, write = os.pipe()  # the write end stays open, silent: a client that keeps stdin open
    try:
        with anyio.fail_after(10):
            async with StdinLines(1_000, 100_000, fd=read) as lines:
                with anyio.move_on_after(0.2):
                    await lines.__anext__()
    finally:
        os.close(write)
        os.close(read)


async def test_a_line_of_more_values_than_the_bound_is_refused_unparsed_and_an_answer_unanswered() -> None:
    # Parsed, 1.3 million "{}" in a 3.9 MB line cost 1.1 s of CPU and 140 MB; over HTTP such a
    # body is refused unparsed (server.max_body_elements), and now a stdio line too.
    values = ",".join(["{}"] * 200)
    request = b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "t", "arguments": {"v": [%s]}}}\n'
    answer = b'{"jsonrpc": "2.0", "id": 3, "result": {"v": [%s]}}\n'
    read, write = os.pipe()
    refused: list[tuple[object, str]] = []

    async def refuse(error: types.JSONRPCError) -> None:
        refused.append((error.id, error.error.message))

    try:
        os.write(write, request % values.encode() + answer % values.encode() + A + b"\n")
        os.close(write)
        with anyio.fail_after(10):
            async with StdinLines(100_000, 100, fd=read) as lines:
                lines.refuse = refuse
                got = [line async for line in lines]
    finally:
        os.close(read)
    assert got == [A.decode() + "\n"]
    assert len(refused) == 1
    assert refused[0][0] == 9
    assert "the limit (server.max_body_elements) is 100" in refused[0][1]


async def test_a_byte_order_mark_that_starts_a_line_is_dropped_and_the_request_read() -> None:
    # A writer set up with .NET's Encoding.UTF8 starts its first line with one: the client's
    # initialize was answered -32700 to a null id, and the client waited for its answer.
    initialize = b'{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}\n'
    read, write = os.pipe()
    refused: list[types.JSONRPCError] = []

    async def refuse(error: types.JSONRPCError) -> None:
        refused.append(error)

    try:
        os.write(write, b"\xef\xbb\xbf" + initialize + b"\xef\xbb\xbf" + A + b"\n")
        os.close(write)
        with anyio.fail_after(10):
            async with StdinLines(100_000, 100_000, fd=read) as lines:
                lines.refuse = refuse
                got = []
                async for line in lines:  # each request answered, as the SDK's answer releases it
                    got.append(line)
                    if (request_id := json.loads(line).get("id")) is not None:
                        lines.in_flight.answered(request_id)
    finally:
        os.close(read)
    assert got == [initialize.decode(), A.decode() + "\n"]
    assert refused == []
