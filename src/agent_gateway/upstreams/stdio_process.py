"""A stdio upstream's process: spawned, watched, stopped and reaped, and how it ended.

Spawned by ``subprocess.Popen`` with ``close_fds``, over pipes the gateway keeps its own
ends of (close-on-exec), read and written through the event loop's pipe transports, not by
the event loop's own spawn. uvloop's ``subprocess_exec`` (what
``anyio.open_process`` runs under ``serve``) marks the child's ends of its pipes inheritable
and libuv does not close them once they are duplicated onto 0, 1 and 2: every server held a
second copy of its stdin, stdout and stderr at higher numbers (and every inheritable
descriptor of the gateway's own, as it implements no ``close_fds``). A server that closed its
stdout to say it was done still held it open, so the gateway read on and saw nothing until a
health check failed (about 40 s with the defaults; half a second on asyncio's own loop).
Pipes, not socket pairs: a socket charges each small write a buffer of its own (a
45-byte answer costs about a kilobyte of the 208 KiB a socket may hold), so a server that
writes without reading filled its stdin after some 250 answers, against a pipe's 1,400.

The process group (``start_new_session``), the stop (close stdin and resume the group, a grace
period, SIGTERM to the group, SIGKILL) and the group's termination are the SDK's, reused. The
group is ended whenever its leader exits (a crash, or the end of its input), so a process it
started that holds its stdout (a helper, a browser) goes with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
from contextlib import suppress
from typing import IO

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from mcp.client.stdio import (
    FORCE_KILL_TIMEOUT,
    PROCESS_TERMINATION_TIMEOUT,
    StdioServerParameters,
    get_default_environment,
)
from mcp.os.posix.utilities import terminate_posix_process_tree

logger = logging.getLogger(__name__)

FLUSH_TIMEOUT = 0.5
"""How long the stdout of an exited leader is read on (held by a process out of its group),
and how long an end of stdout waits to learn the leader's exit status."""
_REAP_TIMEOUT = 2.0
_POLL = 0.02
_WATCH = 0.25
"""How often a leader's exit is looked for where pidfd_open (Linux 5.3) is missing."""


class StdioProcess(Process):
    """A child process over three pipes (its stdin, stdout, stderr), reaped here."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: ByteSendStream,
        stdout: ByteReceiveStream,
        stderr: ByteReceiveStream,
    ) -> None:
        self._popen = popen
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (reaping it); negative: the signal that killed it."""
        return self._popen.poll()

    @property
    def stdin(self) -> ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> ByteReceiveStream:
        return self._stderr

    async def wait(self) -> int:
        await exit_of(self)
        while (code := self.returncode) is None:  # noqa: ASYNC110  (exited: its status about due)
            await anyio.sleep(_POLL)
        return code

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, signal: int) -> None:
        self._popen.send_signal(signal)

    async def aclose(self) -> None:
        """Close the gateway's ends and wait for it (its caller bounds the wait; cancelled,
        it is killed)."""
        for stream in (self._stdin, self._stdout, self._stderr):
            await stream.aclose()
        try:
            await self.wait()
        except BaseException:
            self.kill()
            raise


async def spawned(params: StdioServerParameters) -> StdioProcess:
    """``params``' server started in a process group of its own, holding nothing of the
    gateway's but its stdin, stdout and stderr. Spawned at once (never cancelled half-way,
    which would leave a started process unwatched)."""
    popen = _started(params)
    assert popen.stdin is not None
    assert popen.stdout is not None
    assert popen.stderr is not None
    streams: tuple[_PipeSend, _PipeReceive, _PipeReceive] | None = None
    try:
        with anyio.CancelScope(shield=True):
            streams = (
                await _PipeSend.over(popen.stdin),
                await _PipeReceive.over(popen.stdout),
                await _PipeReceive.over(popen.stderr),
            )
    except BaseException:
        popen.kill()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            pipe.close()
        raise
    assert streams is not None  # a shielded scope is never cancelled
    return StdioProcess(popen, *streams)


class _PipeReceive(ByteReceiveStream):
    """What the process writes to a pipe, read through the event loop's pipe transport."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.ReadTransport) -> None:
        self._reader, self._transport = reader, transport

    @classmethod
    async def over(cls, pipe: IO[bytes]) -> _PipeReceive:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        return cls(reader, transport)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if data := await self._reader.read(max_bytes):
            return data
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self._transport.close()
        self._reader.feed_eof()  # a read waiting now ends
        await anyio.lowlevel.checkpoint()


class _PipeSend(ByteSendStream):
    """The process's stdin, written through the event loop's pipe transport (a write waits
    while the pipe and the transport's buffer are full)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    @classmethod
    async def over(cls, pipe: IO[bytes]) -> _PipeSend:
        loop = asyncio.get_running_loop()
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
        transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
        return cls(asyncio.StreamWriter(transport, protocol, None, loop))

    async def send(self, item: bytes) -> None:
        if self._writer.is_closing():
            raise anyio.ClosedResourceError
        self._writer.write(item)
        await self._writer.drain()

    async def aclose(self) -> None:
        self._writer.close()
        await anyio.lowlevel.checkpoint()


def _started(params: StdioServerParameters) -> subprocess.Popen[bytes]:
    """The process, on the event loop's thread as uvloop's own spawn was: it blocks only until
    the child has run ``exec`` (a millisecond or two), and a worker thread could not be
    cancelled half-way either."""
    return subprocess.Popen(
        [params.command, *params.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env=get_default_environment() | (params.env or {}),
        cwd=params.cwd,
        close_fds=True,
        start_new_session=True,
    )


def how_it_ended(returncode: int | None) -> str:
    """The end of a process's stdout in a few words: its exit status, or that it closed it
    while running on. Nothing of its command line or environment."""
    if returncode is None:
        return "the process closed its stdout"
    if returncode >= 0:
        return f"the process exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"the process was killed by {name}"


async def ended(process: Process) -> str:
    """How ``process`` ended, asked once its stdout has: its exit status if it exits within
    ``FLUSH_TIMEOUT`` (its stdout closes just before its status is readable)."""
    with anyio.move_on_after(FLUSH_TIMEOUT):
        await exit_of(process)
    return how_it_ended(process.returncode)


async def watch(process: Process, reading: anyio.CancelScope) -> None:
    """Once the leader has exited, end what is left of its group; and if its stdout is still
    held open after that (by a daemon that left the group), stop reading it in a moment, so
    the session ends (its calls failing at once) instead of waiting for a line that never
    comes. What the leader wrote before it exited is read first."""
    await exit_of(process)
    await terminate_posix_process_tree(process, FORCE_KILL_TIMEOUT)
    reading.deadline = min(reading.deadline, anyio.current_time() + FLUSH_TIMEOUT)


async def exit_of(process: Process) -> None:
    """Returns once ``process`` has exited (not waiting for its pipes to close, nor for it to
    be reaped): woken by a pidfd where there is one, else polled."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is gone already
        pidfd = None
    try:
        if pidfd is not None:
            await anyio.wait_readable(pidfd)
            return
        while process.returncode is None:  # noqa: ASYNC110  (no event exists for it)
            await anyio.sleep(_WATCH)
    finally:
        if pidfd is not None:
            os.close(pidfd)


async def stop(process: Process, label: str) -> None:
    """Close stdin, give it a grace period, then SIGTERM and SIGKILL its group, whether or not
    the leader exited meanwhile (what it started goes with it); reap it."""
    assert process.stdin is not None
    assert process.stdout is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    _resume(process)
    await _exited(process, PROCESS_TERMINATION_TIMEOUT)
    await terminate_posix_process_tree(process, FORCE_KILL_TIMEOUT)
    if not await _exited(process, _REAP_TIMEOUT):
        logger.warning("upstream session %s: process %d survived SIGKILL; abandoning it", label, process.pid)
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    with anyio.move_on_after(_REAP_TIMEOUT):
        await process.aclose()


def _resume(process: Process) -> None:
    """SIGCONT to its group. A stopped process (SIGSTOP, a debugger's, a terminal's) sees no
    end of its input and acts on no SIGTERM: it was killed only once both grace periods had
    passed (4 s). Shells and systemd send SIGCONT with SIGTERM for the same reason."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGCONT)


async def _exited(process: Process, within: float) -> bool:
    # Polled, not process.wait(): that also waits for EOF on pipes a grandchild may hold.
    with anyio.move_on_after(within):
        while process.returncode is None:  # noqa: ASYNC110  (no event exists for it)
            await anyio.sleep(_POLL)
        return True
    return False
