"""The listener's protocol on a real uvicorn connection: a response's head sent with its body
(``listener.HeadWithBody``), seen in the writes that reach the transport; a request head's
size and header lines bounded; a pipelined request not cut off by the next head's deadline,
and requests pipelined past their bound, seen on a raw socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx
from starlette.types import Receive, Scope, Send

from agent_gateway.listener import MAX_PIPELINED, Connections, bounded_protocol
from tests.support import serving


class Recorded:
    """A connection's real transport, with what is written to it kept in order."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


BIG = 32 * 2**20


async def answer(scope: Scope, receive: Receive, send: Send, release: anyio.Event) -> None:
    await receive()
    if scope["path"] == "/two":  # 2 MiB in 1 MiB slices, as in_flight.Outflow writes it
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % 2**21)]}
        )
        for _ in range(2):
            await send({"type": "http.response.body", "body": b"x" * 2**20, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/big":  # 32 MiB in 1 MiB slices, as in_flight.Outflow writes it
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % BIG)]}
        )
        for _ in range(32):
            await send({"type": "http.response.body", "body": b"x" * 2**20, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        release.set()  # the app has let go of its answer
        return
    if scope["path"] == "/watched":  # told once its client has gone, as a stream or a call is
        while (await receive())["type"] != "http.disconnect":
            pass
        release.set()
        return
    if scope["path"] == "/held":  # answered once the test releases it
        await release.wait()
    if scope["path"] in ("/json", "/held"):
        body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await release.wait()  # the head must reach the client before any body
    await send({"type": "http.response.body", "body": b"data: 1\n\n"})


@asynccontextmanager
async def listening(
    writes: list[bytes],
    release: anyio.Event,
    header_timeout: float = 5.0,
    write_timeout: float = 30.0,
    reads: list[bytes] | None = None,
    min_read_rate: int = 4096,
    send_buffer: int | None = None,
) -> AsyncIterator[str]:
    connections = Connections(
        cap=16,
        per_address=16,
        header_timeout=header_timeout,
        write_timeout=write_timeout,
        min_read_rate=min_read_rate,
    )
    base = bounded_protocol(connections)

    class Recording(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if send_buffer is not None:  # the kernel's own buffer small: the transport's fills
                transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer
                )
            super().connection_made(Recorded(transport, writes))  # type: ignore[arg-type]

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if reads is not None:
                reads.append(data)  # once the protocol has taken it

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            for done in ("lifespan.startup.complete", "lifespan.shutdown.complete"):
                await receive()
                await send({"type": done})
            return
        await answer(scope, receive, send, release)

    async with serving(app, http=Recording) as url:
        yield url


async def test_a_json_answer_is_written_once_with_its_head_and_a_stream_head_is_not_held() -> None:
    writes: list[bytes] = []
    release = anyio.Event()
    async with listening(writes, release) as url, httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(f"{url}/json", content=b"{}")
        assert answer.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert len(writes) == 1, writes  # before: the head, then the body
        assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert writes[0].endswith(b'\r\n\r\n{"jsonrpc":"2.0","id":1,"result":{}}')

        del writes[:]
        async with client.stream("POST", f"{url}/stream", content=b"{}") as stream:
            # The head arrives while the app still waits to send the body: held for one turn only.
            assert stream.headers["content-type"] == "text/event-stream"
            assert len(writes) == 1
            assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
            release.set()
            assert await stream.aread() == b"data: 1\n\n"


async def _exchange(url: str, parts: list[bytes]) -> tuple[int, bytes]:
    """Send ``parts`` on a raw connection until the gateway closes it; the bytes sent and all
    that came back."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    async with await anyio.connect_tcp(host, int(port)) as stream:
        for part in parts:
            try:
                await stream.send(part)
            except (anyio.BrokenResourceError, OSError):
                break
            sent += len(part)
        answer = b""
        with anyio.fail_after(10):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return sent, answer


async def test_an_endless_head_is_refused_with_431_once_it_passes_its_bound() -> None:
    head = b"GET /json HTTP/1.1\r\nhost: x\r\nx-endless: "
    async with listening([], anyio.Event()) as url:
        # 64 KiB is the bound; the client stops with the piece that passes it (its socket is read dry
        # and the 431 is not lost to a reset).
        sent, answer = await _exchange(url, [head] + [b"a" * 8192] * 8)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"a request head over 65536 bytes" in answer
        assert sent == len(head) + 8 * 8192


async def test_a_head_of_too_many_header_lines_is_refused_and_a_large_one_within_bounds_is_served() -> None:
    lines = b"".join(b"x-%d: 1\r\n" % n for n in range(201))
    async with listening([], anyio.Event()) as url:
        _, answer = await _exchange(url, [b"GET /json HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n"])
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"over 200 header lines" in answer
        async with httpx.AsyncClient(timeout=10) as client:
            served = await client.post(f"{url}/json", content=b"{}", headers={"cookie": "c" * 40_000})
            assert served.status_code == 200


async def test_a_pipelined_request_running_past_the_head_deadline_is_answered() -> None:
    release = anyio.Event()
    first = b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    held = b"POST /held HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    async with listening([], release, header_timeout=0.5) as url, anyio.create_task_group() as tg:
        host, port = url.removeprefix("http://").split(":")
        async with await anyio.connect_tcp(host, int(port)) as pipelined:
            await pipelined.send(first + held)  # the second head arrives with the first
            answered = b""
            with anyio.fail_after(10):
                while b"HTTP/1.1 200" not in answered:
                    answered += await pipelined.receive()
            # The held request now runs; it is released only after its connection's head
            # deadline, armed when the first answer was written, has passed.
            tg.start_soon(_hold_until_an_idle_connection_is_closed, url, release)
            with anyio.fail_after(10):
                while answered.count(b"HTTP/1.1 200") < 2:
                    answered += await pipelined.receive()  # before: closed at the deadline
        assert answered.count(b'"result":{}') == 2


async def _hold_until_an_idle_connection_is_closed(url: str, release: anyio.Event) -> None:
    # A connection opened now, that sends nothing, is closed by its head deadline: by then
    # the one armed after the first response has passed too.
    await _exchange(url, [])
    release.set()


def _unread_request(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
    return sock


def _read_all(sock: socket.socket) -> int:
    got = 0
    sock.settimeout(10)
    try:
        while chunk := sock.recv(2**20):
            got += len(chunk)
    except ConnectionResetError:
        pass  # dropped: what the kernel still held for it is gone too
    return got


async def test_a_client_that_reads_nothing_of_its_answer_is_dropped_and_the_answer_let_go() -> None:
    written = anyio.Event()
    async with listening([], written, write_timeout=0.5) as url:
        sock = await anyio.to_thread.run_sync(_unread_request, int(url.rsplit(":", 1)[1]))
        try:
            with anyio.fail_after(10):
                await written.wait()  # before: the app waited for the client for ever
            got = await anyio.to_thread.run_sync(_read_all, sock)
        finally:
            sock.close()
        assert got < BIG
        async with httpx.AsyncClient(timeout=10) as client:  # a client that reads is served whole
            assert len((await client.get(f"{url}/big")).content) == BIG


def _post(path: bytes, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (path, len(body), body)


async def _answers(url: str, data: bytes, count: int) -> bytes:
    """Send ``data`` on a raw connection; what came back once ``count`` answers did, or the
    connection closed."""
    host, port = url.removeprefix("http://").split(":")
    got = b""
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(data)
        with anyio.fail_after(10):
            while got.count(b"HTTP/1.1 ") < count:
                try:
                    got += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):  # closed, or dropped
                    break
    return got


async def test_a_request_ending_just_short_of_the_bound_and_the_next_one_pipelined_are_both_answered() -> (
    None
):
    async with listening([], anyio.Event()) as url:
        first = _post(b"/json", b"")
        first = _post(b"/json", b"x" * (65536 - 10 - len(first)))  # ends 10 bytes short of 64 KiB
        got = await _answers(url, first + _post(b"/json", b"{}"), 2)
    assert got.count(b"HTTP/1.1 200 OK") == 2, got[:300]  # before: one 431


async def test_trailers_count_against_the_bound_not_against_the_next_head() -> None:
    chunked = b"POST /json HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
    trailers = b"".join(b"x-t%d: v\r\n" % n for n in range(150)) + b"\r\n"
    lines = b"".join(b"x-h%d: v\r\n" % n for n in range(60))
    async with listening([], anyio.Event()) as url:
        # 150 trailer lines, then a head of 62: each is within 200 (before: 431 for the second).
        got = await _answers(
            url, chunked + trailers + b"GET /json HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n", 2
        )
        assert got.count(b"HTTP/1.1 200 OK") == 2, got[:300]
        # Too many trailer lines, in the read that ends the body: the connection is dropped
        # (before: 350 lines kept with the request, or, after a head, a 431 sent as well).
        many = b"".join(b"x-t%d: v\r\n" % n for n in range(350)) + b"\r\n"
        dropped = await _answers(url, chunked + many, 1)
        assert dropped == b"", dropped[:300]  # before: a 431 for a request already being served
        # An endless trailer line is cut off like an endless head (before: kept whole, unbounded).
        sent, _ = await _exchange(url, [chunked + b"x-endless: "] + [b"a" * 8192] * 16)
        assert sent < len(chunked) + 11 + 16 * 8192


async def test_a_client_that_reads_slowly_but_steadily_is_not_dropped() -> None:
    # At 512 KiB a second it reads a 1 MiB slice in 2 s, past the 1 s deadline; before, the
    # deadline ran from the buffer filling until it drained below its low mark: dropped.
    # The kernel's send buffer small, so the slice waits in the transport's (loopback's own
    # would take it whole, and no deadline would ever start).
    async with listening([], anyio.Event(), write_timeout=1, send_buffer=16384) as url:
        got = await anyio.to_thread.run_sync(_slow_reader_of_2_mib, int(url.rsplit(":", 1)[1]))
    assert got == 2 * 2**20


async def test_a_client_that_reads_a_trickle_of_its_answer_is_dropped_and_the_answer_let_go() -> None:
    # 4 KiB ten times a second, under the 64 KiB a second asked here: before, any byte read
    # within each window kept the connection (and its answer) for as long as the client liked.
    written = anyio.Event()
    async with (
        listening([], written, write_timeout=1, min_read_rate=64 * 1024, send_buffer=16384) as url,
        anyio.create_task_group() as tg,
    ):
        reader = partial(_slow_reader, int(url.rsplit(":", 1)[1]), b"/big", BIG, 4096, 0.1, 6.0)
        tg.start_soon(anyio.to_thread.run_sync, reader)
        with anyio.fail_after(5):
            await written.wait()  # before: the app still waited on the client


def _slow_reader_of_2_mib(port: int) -> int:
    # SO_RCVBUF 4096: each read takes about 4 KiB, so 128 reads a second are 512 KiB a second.
    return _slow_reader(port, b"/two", 2 * 2**20, 16384, 1 / 128, 60.0)


def _slow_reader(port: int, path: bytes, size: int, chunk: int, pause: float, within: float) -> int:
    """Bytes of the body read, ``chunk`` every ``pause`` seconds, until ``size`` came, the
    connection was dropped, or ``within`` seconds passed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path)
    head, got = b"", 0
    sock.settimeout(10)
    deadline = time.monotonic() + within
    try:
        while b"\r\n\r\n" not in head and (byte := sock.recv(1)):
            head += byte
        while got < size and time.monotonic() < deadline and (data := sock.recv(chunk)):
            got += len(data)
            time.sleep(pause)
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        sock.close()
    return got


async def test_an_empty_line_before_a_request_is_ignored() -> None:
    # RFC 9112 2.2: a server should ignore at least one empty line before a request line
    # (before: the head's line count read uvicorn's list before it existed, a TypeError).
    reads: list[bytes] = []
    async with listening([], anyio.Event(), reads=reads) as url:
        host, port = url.removeprefix("http://").split(":")
        got = b""
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(b"\r\n")  # a read of its own
            with anyio.fail_after(10):
                while not reads:
                    await anyio.sleep(0.01)
                await stream.send(_post(b"/json", b"{}"))
                while b"{}}" not in got:
                    got += await stream.receive()
    assert got.startswith(b"HTTP/1.1 200 OK"), got[:200]


async def test_requests_pipelined_past_the_bound_drop_their_connection_and_a_few_are_answered() -> None:
    # uvicorn parses every request a read holds, queues each behind the one served, and
    # reads on after each answer: one connection pipelining GETs of /healthz took the gateway
    # from 170 MB to 1 GB in 20 s (130 answered), and kept it once closed.
    async with listening([], anyio.Event()) as url:
        few = await _answers(url, _post(b"/json", b"{}") * 3, 3)
        many = await _answers(url, _post(b"/json", b"{}") * 1000, 1000)  # ends once dropped
    assert few.count(b"HTTP/1.1 200 OK") == 3, few[:300]
    # The one served and those queued behind it are answered, then the connection closed
    # (before: all 1,000 queued; then, dropped at once, none answered, however often retried).
    assert many.count(b"HTTP/1.1 200 OK") == MAX_PIPELINED + 1, many.count(b"HTTP/1.1 200 OK")


async def test_a_pipelined_requests_body_waiting_past_its_bound_drops_the_connection() -> None:
    # A pipelined request's body waits in uvicorn's buffer, uncounted, until its turn: 100
    # connections each holding a slow call and 3 MiB of the next request's body took the
    # gateway from 166 to 229 MB (a read's worth more at each answer on the connection).
    release = anyio.Event()
    async with listening([], release) as url:
        host, port = url.removeprefix("http://").split(":")
        async with await anyio.connect_tcp(host, int(port)) as stream:
            waiting = b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % 2**20
            await stream.send(_post(b"/held", b"{}") + waiting + b" " * 2**20)
            with anyio.fail_after(10), contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:  # before: held, the body buffered, for as long as /held ran
                    await stream.receive()
        release.set()
        got = await _answers(url, _post(b"/json", b"{}") + _post(b"/json", b"x" * 2**16), 2)
    assert got.count(b"HTTP/1.1 200 OK") == 2, got[:300]  # a small body pipelined is served


async def test_the_request_served_is_told_its_client_left_with_requests_pipelined_behind_it() -> None:
    # uvicorn tells only the request read last that its connection was lost: the one being
    # served, with a request waiting behind it, never learnt it (a GET's stream held its
    # session's stream for ever, a call went on for an answer nobody read): one request behind
    # it, or more than the bound (the listener then reads no more, and the client closes).
    for behind in (1, MAX_PIPELINED + 1):
        gone = anyio.Event()
        async with listening([], gone) as url:
            host, port = url.removeprefix("http://").split(":")
            async with await anyio.connect_tcp(host, int(port)) as stream:
                await stream.send(_post(b"/watched", b"{}") + _post(b"/json", b"{}") * behind)
            with anyio.fail_after(10):  # before: never told
                await gone.wait()
