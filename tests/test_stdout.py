"""A stdio client's answers on fd 1 (``downstream/stdout.py``): while the gateway serves, fd 1
is pointed at stderr, so a stray write by a handler or a library cannot land on the wire
between two answers; the answers go to the wire, fd 1 is the wire again afterwards, and the
copy of it the answers were written to is closed."""

from __future__ import annotations

import os

import pytest

from agent_gateway.downstream.stdout import StdoutLines


async def test_a_stray_write_to_fd_1_while_serving_goes_to_stderr_not_between_the_answers(
    capfd: pytest.CaptureFixture[str],
) -> None:
    wire, fd = os.pipe()  # ``fd`` stands for fd 1; the client reads ``wire``
    os.set_blocking(wire, False)  # what is written is there once serving ends: read, not waited for
    try:
        async with StdoutLines(fd=fd) as answers:
            await answers.write('{"id": 1}\n')
            os.write(fd, b"a handler's print\n")
            await answers.write('{"id": 2}\n')
        os.write(fd, b"after serving\n")
        os.close(fd)
        assert os.read(wire, 1 << 16) == b'{"id": 1}\n{"id": 2}\nafter serving\n'
        assert os.read(wire, 1) == b""  # the end: no copy of the write end is left open
    finally:
        os.close(wire)
    assert capfd.readouterr().err == "a handler's print\n"
