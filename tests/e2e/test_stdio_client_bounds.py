"""A stdio client that writes requests and reads none of the answers: held back by its own
pipe once ``MAX_IN_FLIGHT`` requests are unanswered, and its end of input ends the gateway
(its upstreams reaped) though the answers left are never taken. Its requests are bounded as
an HTTP client's are: an id past 256 characters (an integer's: digits), a second request
under an id in flight. A stdout pipe left non-blocking is waited on when full, not given up."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from anyio.abc import ByteSendStream, Process
from anyio.streams.buffered import BufferedByteReceiveStream

from agent_gateway.downstream.stdout import MAX_IN_FLIGHT
from tests.e2e.peers import BOUND, descendants
from tests.e2e.test_stdio_gateway import AGENT_GATEWAY, _initialize, all_exited, serve_args
from tests.support import gateway_env, python_upstream

pytestmark = pytest.mark.e2e

FLOOD = 3000


def stdio_config(
    tmp_path: Path, calls: Path, recorded: Path | None = None, drain: float | None = None
) -> Path:
    raw = python_upstream("raw_stdio.py", env={"RAW_CALLS": str(calls)})
    upstreams = {"raw": raw, "slow": python_upstream("faulty.py")}
    if recorded is not None:  # an upstream that writes what reaches it there (tests/servers/recorder.py)
        upstreams["rec"] = python_upstream("recorder.py", env={"RECORDER_LOG": str(recorded)})
    path = tmp_path / "gateway.yaml"
    server: dict[str, Any] = {"transport": "stdio"} | ({"stdio_drain": drain} if drain is not None else {})
    path.write_text(yaml.safe_dump({"server": server, "upstreams": upstreams}))
    return path


async def exited(gateway: subprocess.Popen[bytes]) -> None:
    """Until ``gateway`` has exited, within ``BOUND``."""
    with anyio.fail_after(BOUND):
        await anyio.to_thread.run_sync(gateway.wait, abandon_on_cancel=True)


def stopped(gateway: subprocess.Popen[bytes]) -> None:
    """``gateway`` killed and reaped if the test left it running (a wait that failed)."""
    if gateway.poll() is None:
        gateway.kill()
        gateway.wait()


def call(request_id: Any, name: str = "raw__hello", **arguments: Any) -> bytes:
    params = {"name": name, "arguments": arguments}
    return (
        json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()
        + b"\n"
    )


async def initialized(process: Process) -> BufferedByteReceiveStream:
    assert process.stdin is not None
    assert process.stdout is not None
    replies = BufferedByteReceiveStream(process.stdout)
    with anyio.fail_after(BOUND):
        await process.stdin.send(json.dumps(_initialize()).encode() + b"\n")
        await replies.receive_until(b"\n", 1_000_000)
    return replies


@asynccontextmanager
async def undrained_gateway(args: list[str], stderr: Any) -> AsyncIterator[subprocess.Popen[bytes]]:
    """``args`` run as a stdio gateway on pipes no reader drains (the kernel's 64 KiB of
    answers, no event loop's read-ahead), initialized; its stdin non-blocking. Stopped after."""
    gateway = subprocess.Popen(
        args, env=gateway_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
    )
    try:
        assert gateway.stdin is not None
        assert gateway.stdout is not None
        gateway.stdin.write(json.dumps(_initialize()).encode() + b"\n")
        gateway.stdin.flush()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(gateway.stdout.readline, abandon_on_cancel=True)
        os.set_blocking(gateway.stdin.fileno(), False)
        yield gateway
    finally:
        stopped(gateway)
        for pipe in (gateway.stdin, gateway.stdout):
            if pipe is not None:
                pipe.close()


@asynccontextmanager
async def stdio_gateway(
    args: list[str],
) -> AsyncIterator[tuple[Process, ByteSendStream, BufferedByteReceiveStream]]:
    """``agent-gateway serve`` over stdio with ``args``, initialized: its process, its stdin
    and its answers."""
    process = await anyio.open_process([AGENT_GATEWAY, *args], env=gateway_env())
    async with process:
        replies = await initialized(process)
        assert process.stdin is not None
        yield process, process.stdin, replies


def recorded(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


async def settled(calls: Path) -> int:
    """The calls the upstream recorded once they stop coming (or all have come)."""
    seen, still = -1, 0
    with anyio.fail_after(120):
        while still < 8 and seen < FLOOD:
            await anyio.sleep(0.25)
            now = recorded(calls)
            seen, still = now, (still + 1 if now == seen else 0)
    return seen


async def test_a_client_reading_no_answers_is_held_back_and_its_end_of_input_ends_the_gateway(
    tmp_path: Path,
) -> None:
    # Each request was served and its answer kept until stdout took it: 52,000 listings in
    # 40 s held 2 GB. At the end of input, the SDK's writer, blocked on the full pipe, held
    # the gateway (1.1 GB, its upstreams running) for as long as the client lived.
    calls = tmp_path / "calls"
    stderr = tmp_path / "gateway.stderr"
    args = [AGENT_GATEWAY, *serve_args(stdio_config(tmp_path, calls, drain=1))]
    with stderr.open("wb") as log:
        async with undrained_gateway(args, log) as gateway:
            assert gateway.stdin is not None
            children = descendants(gateway.pid)
            flood, served = b"".join(call(n) for n in range(FLOOD)), 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(_written, gateway.stdin.fileno(), flood)
                served = await settled(calls)
                tg.cancel_scope.cancel()
            # The in-flight bound, plus what the stdout pipe holds of ~100-byte answers.
            assert served < FLOOD // 2, served
            gateway.stdin.close()  # the end of input; stdout is still never read
            await exited(gateway)
    await all_exited(children)
    assert "input ended 1 s ago and the answers left are not taken: stopping" in stderr.read_text()


async def _written(fd: int, data: bytes) -> None:
    """``data`` written to the non-blocking ``fd`` as fast as its reader takes it."""
    while data:
        try:
            data = data[os.write(fd, data[:65536]) :]
        except BlockingIOError:
            await anyio.sleep(0.02)


async def test_a_stdio_requests_long_id_or_an_id_in_flight_is_refused_as_over_http(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    async with stdio_gateway(serve_args(stdio_config(tmp_path, calls))) as (process, stdin, replies):
        with anyio.fail_after(BOUND):
            slow = call(7, "slow__slow", seconds=3)  # in flight while the next two are read
            await stdin.send(call("x" * 300_000) + call(10**4000) + slow + call(7) + call(8))
            answers = [json.loads(await replies.receive_until(b"\n", 1_000_000)) for _ in range(5)]
            await stdin.aclose()
            await process.wait()
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for answer in answers:
        by_id.setdefault(answer["id"], []).append(answer)
    long_id, long_number = by_id[None]  # not echoed: its id is the bulk of it
    assert "a request id of 300000 characters; the limit is 256" in long_id["error"]["message"]
    assert "a request id of over 256 digits" in long_number["error"]["message"]  # before: served
    refused, served = by_id[7]  # the second 7 refused at once, the slow one answered later
    assert "a request with id 7 is in flight already" in refused["error"]["message"]
    assert served["result"]["content"][0]["text"] == "slept 3s"
    assert "result" in by_id[8][0]
    assert recorded(calls) == 1  # id 8 alone reached the upstream


def _in_flight(recorded: Path) -> int:
    """The calls the recorder upstream has started."""
    return (recorded.read_text() if recorded.exists() else "").count('"started"')


async def test_a_call_in_flight_when_the_client_closes_stdin_completes_upstream_and_is_answered(
    tmp_path: Path,
) -> None:
    # Before, the SDK cancelled it at the end of input (the upstream told, the client answered
    # "Connection closed"), though the answers in flight were promised WRITE_GRACE to be written.
    # A call longer than the grace (server.stdio_drain, here 2 s) is still answered so, and
    # its upstream told.
    calls, recorded = tmp_path / "calls", tmp_path / "recorded"
    args = serve_args(stdio_config(tmp_path, calls, recorded, drain=2))
    async with stdio_gateway(args) as (process, stdin, replies):
        await stdin.send(call(2, "rec__wait", seconds=0.5) + call(3, "rec__wait", seconds=120))
        with anyio.fail_after(BOUND):
            while _in_flight(recorded) < 2:
                await anyio.sleep(0.05)
        await stdin.aclose()  # half-closed: its stdout is still read
        with anyio.fail_after(BOUND):
            answers = [json.loads(await replies.receive_until(b"\n", 1_000_000)) for _ in range(2)]
            await process.wait()
    done, given_up = sorted(answers, key=lambda answer: answer["id"])
    assert done.get("result", {}).get("content", [{}])[0].get("text") == "done", done
    assert given_up["error"]["message"] == "Connection closed", given_up
    events = [json.loads(line)["event"] for line in recorded.read_text().splitlines()]
    assert events.count("handler_cancelled") == 1, events


async def test_a_client_that_closes_stdout_ends_the_gateway_its_calls_cancelled_and_upstreams_reaped(
    tmp_path: Path,
) -> None:
    # The writer's EPIPE was logged (with a traceback from its flush) and the gateway went on
    # reading requests and calling upstreams for answers nobody read, for as long as the
    # client kept stdin open, which it does here.
    calls, recorded = tmp_path / "calls", tmp_path / "recorded"
    stderr = tmp_path / "gateway.stderr"
    args = [AGENT_GATEWAY, *serve_args(stdio_config(tmp_path, calls, recorded))]
    with stderr.open("wb") as log:
        gateway = subprocess.Popen(
            args, env=gateway_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
        )
    assert gateway.stdin is not None
    assert gateway.stdout is not None
    try:
        gateway.stdin.write(json.dumps(_initialize()).encode() + b"\n")
        gateway.stdin.flush()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(gateway.stdout.readline, abandon_on_cancel=True)
        children = descendants(gateway.pid)
        gateway.stdin.write(call(1, "rec__wait", seconds=120))
        gateway.stdin.flush()
        with anyio.fail_after(BOUND):  # in flight at the upstream
            while not _in_flight(recorded):
                await anyio.sleep(0.05)
        gateway.stdout.close()  # the client reads no more; its stdin stays open
        gateway.stdin.write(call(2))  # whose answer finds stdout closed
        gateway.stdin.flush()
        await exited(gateway)
    finally:
        stopped(gateway)
        gateway.stdin.close()
    await all_exited(children)
    assert gateway.returncode == 0
    logged = stderr.read_text()
    assert "the client closed stdout and reads no answers: stopping" in logged
    assert "Traceback" not in logged
    events = [json.loads(line)["event"] for line in recorded.read_text().splitlines()]
    assert "handler_cancelled" in events, events  # the call in flight was cancelled upstream


async def test_a_stdout_pipe_left_non_blocking_is_waited_on_when_full_and_every_answer_written(
    tmp_path: Path,
) -> None:
    # O_NONBLOCK is the pipe's, shared with whoever opened it: a client (or the process whose
    # stdout the gateway inherits: Node sets its own pipes so) may hand one over. A full pipe
    # then fails a write with EAGAIN, which before was taken for a closed stdout: the answers
    # after it dropped, the client waiting for them.
    calls = tmp_path / "calls"
    reading, writing = os.pipe()
    os.set_blocking(writing, False)
    args = [AGENT_GATEWAY, *serve_args(stdio_config(tmp_path, calls))]
    gateway = subprocess.Popen(args, env=gateway_env(), stdin=subprocess.PIPE, stdout=writing)
    os.close(writing)
    assert gateway.stdin is not None
    answers, lines = os.fdopen(reading, "rb"), list[bytes]()
    try:
        gateway.stdin.write(json.dumps(_initialize()).encode() + b"\n")
        gateway.stdin.flush()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(answers.readline, abandon_on_cancel=True)
        os.set_blocking(gateway.stdin.fileno(), False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_written, gateway.stdin.fileno(), b"".join(call(n) for n in range(FLOOD)))
            await settled(calls)  # held by the full pipe (~100-byte answers; the pipe holds 64 KiB)
            with anyio.fail_after(120):  # before: the answers past the full pipe never came
                lines = [
                    await anyio.to_thread.run_sync(answers.readline, abandon_on_cancel=True)
                    for _ in range(FLOOD)
                ]
        gateway.stdin.close()
        await exited(gateway)
    finally:
        stopped(gateway)
        answers.close()
    assert sorted(json.loads(line)["id"] for line in lines) == list(range(FLOOD))
    assert recorded(calls) == FLOOD


async def test_requests_one_after_another_past_the_in_flight_bound_are_all_served(tmp_path: Path) -> None:
    # Each answer handed to stdout releases its request's place in flight: a client that
    # reads each answer before its next request is never held, however many it sends.
    calls = tmp_path / "calls"
    async with stdio_gateway(serve_args(stdio_config(tmp_path, calls))) as (process, stdin, replies):
        answers = []
        with anyio.fail_after(BOUND):
            for n in range(MAX_IN_FLIGHT * 2):
                await stdin.send(call(n))
                answers.append(json.loads(await replies.receive_until(b"\n", 1_000_000)))
            await stdin.aclose()
            await process.wait()
    assert [answer["id"] for answer in answers] == list(range(MAX_IN_FLIGHT * 2))
    assert all("result" in answer for answer in answers), answers[-1]


async def test_the_last_answer_is_written_whole_to_a_slow_reader_before_the_gateway_exits(
    tmp_path: Path,
) -> None:
    # The end of input ends serving once the calls in flight are answered; the last answer,
    # handed to stdout's writer, is still being written while the client reads slowly:
    # the gateway waits for it (up to server.stdio_drain) rather than exit mid-line.
    calls = tmp_path / "calls"
    megabytes = 4
    config = stdio_config(tmp_path, calls, drain=8)
    args = ["--log-level", "info", *serve_args(config)[2:]]  # the line waited for
    async with stdio_gateway(args) as (process, stdin, replies):
        await stdin.send(call(2, "slow__big", megabytes=megabytes))
        await stdin.aclose()
        assert process.stderr is not None
        log = BufferedByteReceiveStream(process.stderr)
        with anyio.fail_after(BOUND):  # the answer fills the pipe, and the gateway ends serving
            while b"stdio: serving ended, an answer still being written" not in await log.receive_until(
                b"\n", 65536
            ):
                pass
        # The reader is slow: half the drain, unless the gateway exits before (mid-line).
        with anyio.move_on_after(4):
            await process.wait()
        with anyio.fail_after(BOUND):
            answer = json.loads(await replies.receive_until(b"\n", 4 * megabytes << 20))
            await process.wait()
    assert len(answer["result"]["content"][0]["text"]) == megabytes << 20
