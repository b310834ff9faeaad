"""What the gateway writes to disk (its audit trail, tool pins, conversation memory) when the
disk fills: it serves on, keeps what it can, says what it could not write, and resumes.

A real OS error, without mounting a filesystem: the gateway process's file size limit
(``RLIMIT_FSIZE``, set from outside with ``prlimit``) lowered mid-run makes its writes past it
fail with EFBIG (Python ignores SIGXFSZ), as a full disk fails them with ENOSPC; raised again,
space has returned."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError

from agent_gateway.cli import main
from tests.agent.test_models import said, sampling_client
from tests.security.test_audit import _server, records
from tests.support import gateway_child, python_upstream, running_gateway, serving_upstream
from tests.test_upstreams import text_of, wait_until

BOUND = 60.0
UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def _limit(child: subprocess.Popen[bytes], size: int | None) -> None:
    """Files of ``child`` cannot grow past ``size`` bytes (None: as large as they like)."""
    resource.prlimit(child.pid, resource.RLIMIT_FSIZE, UNLIMITED if size is None else (size, UNLIMITED[1]))


@asynccontextmanager
async def _piped_log() -> AsyncIterator[tuple[Path, list[bytes]]]:
    """A path for ``gateway_child``'s log that is a pipe, read as it is written (a file would
    be limited with the process's other files), and what was read from it."""
    read, write = os.pipe()
    said: list[bytes] = []

    async def drain() -> None:  # to the end of the pipe: once the gateway has exited
        while chunk := await anyio.to_thread.run_sync(os.read, read, 1 << 16):
            said.append(chunk)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            try:
                yield Path(f"/dev/fd/{write}"), said
            finally:
                os.close(write)
    finally:
        os.close(read)


async def _until(done: Callable[[], bool]) -> None:
    await wait_until(done, BOUND)


async def test_a_full_disk_leaves_the_trail_whole_and_says_what_was_lost_once_it_is_written_again(
    tmp_path: Path,
) -> None:
    # A failed write ended the gateway (its writer's OSError through the task group: every
    # client cut off) and left half a record in the trail, which verify then called broken.
    trail = tmp_path / "audit.jsonl"
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"enabled": False},
            "audit": {"path": str(trail), "queue": 16},
        }
        async with (
            _piped_log() as (log, output),
            gateway_child(config, tmp_path, log) as (base, child),
            Client(f"{base}/mcp") as c,
            httpx.AsyncClient(timeout=BOUND) as http,
        ):

            async def audit_status() -> str:
                return (await http.get(f"{base}/status")).json()["audit"]

            async def calls(n: int, text: str) -> None:
                for _ in range(n):
                    assert not (await c.call_tool("desk__echo", {"text": text})).is_error

            await calls(3, "before")
            await _until(lambda: len(_written(trail)) == 3)
            _limit(child, trail.stat().st_size + 100)  # the disk is full, part of a record fits
            await calls(40, "full")  # served throughout: 16 wait in the queue, the rest dropped
            with anyio.fail_after(BOUND):
                while (status := await audit_status()) == "writing":
                    await anyio.sleep(0.05)
            assert status == f"cannot be written ({trail}: File too large)"
            _limit(child, None)  # space again
            with anyio.fail_after(BOUND):
                while await audit_status() != "writing":
                    await anyio.sleep(0.05)
            await calls(1, "after")
            after = hashlib.sha256(b'{"text":"after"}').hexdigest()
            await _until(lambda: _written(trail)[-1:] == [after])
    kept = records(trail)
    [gap] = [r for r in kept if r["method"] == "audit/gap"]
    echoed = [r for r in kept if r["name"] == "desk__echo"]
    assert len(echoed) + gap["lost"] == 44  # every call is a record, or counted in the gap
    assert gap["seq"] == kept.index(gap) + 1
    assert "No space" in gap["detail"] or "File too large" in gap["detail"]
    assert main(["audit", "verify", str(trail)]) == 0
    said_ = b"".join(output).decode()
    assert said_.count("audit: cannot write") == 1
    assert said_.count(f"audit: writing {trail} again") == 1
    assert "Traceback" not in said_


async def _until_unready(http: httpx.AsyncClient, base: str) -> None:
    """Until the gateway at ``base`` says it is not ready (its trail found failing)."""
    with anyio.fail_after(BOUND):
        while (await http.get(f"{base}/readyz")).status_code == 200:
            await anyio.sleep(0.05)


def _written(trail: Path) -> list[str | None]:
    """The arguments' digests of the records in ``trail`` so far (a line being written is not one)."""
    if not trail.exists():
        return []
    lines = trail.read_bytes().split(b"\n")[:-1]
    return [json.loads(line)["arguments_sha256"] for line in lines]


async def test_pins_that_cannot_be_written_withhold_the_new_tool_and_keep_its_upstream(
    tmp_path: Path,
) -> None:
    # SQLite's "database or disk is full" from the review of a changed listing took the
    # upstream down: restarted, every call on it failed meanwhile.
    memory = tmp_path / "state" / "conversations.sqlite"
    config = {
        "upstreams": {"counter": python_upstream("counter.py")},
        "agent": {"enabled": False, "memory": {"store": "sqlite", "path": str(memory)}},
        "audit": {"path": str(tmp_path / "audit.jsonl")},
    }
    async with (
        _piped_log() as (log, output),
        gateway_child(config, tmp_path, log) as (base, child),
        Client(f"{base}/mcp") as c,
    ):
        pid = text_of(await c.call_tool("counter__pid", {}))
        _limit(child, 512)  # no SQLite page can be written
        assert not (await c.call_tool("counter__add_tool", {"name": "fresh"})).is_error
        await _until(lambda: b"pins not recorded" in b"".join(output))
        assert text_of(await c.call_tool("counter__pid", {})) == pid  # the same process serves on
        names = {t.name for t in (await c.list_tools()).tools}
        assert "counter__increment" in names
        assert "counter__fresh" not in names  # withheld: its pin could not be recorded
        await _until(lambda: b"".join(output).count(b"changed its catalog; refreshed") >= 2)  # retried
        _limit(child, None)
        # Reviewed again once the disk has room, though the upstream does not list again
        # (before, its next change was waited for: withheld until then, maybe for ever).
        with anyio.fail_after(BOUND):
            while "counter__fresh" not in {t.name for t in (await c.list_tools()).tools}:
                await anyio.sleep(0.05)
        assert not (await c.call_tool("counter__add_tool", {"name": "later"})).is_error
        with anyio.fail_after(BOUND):
            while not {"counter__fresh", "counter__later"} <= {t.name for t in (await c.list_tools()).tools}:
                await anyio.sleep(0.05)
    said_ = b"".join(output)
    assert b"is down" not in said_
    # Said once, not at each retry (every 5 s while the disk is full), and said when it ends.
    assert said_.count(b"pins not recorded") == 1
    assert said_.count(b"pins recorded again") == 1


_ASK = {"query": "hello", "conversation_id": "kept"}


@asynccontextmanager
async def _answered_once(
    tmp_path: Path, memory: Path
) -> AsyncIterator[tuple[Client, subprocess.Popen[bytes], list[bytes]]]:
    """A gateway process whose agent keeps its conversations in SQLite at ``memory``, a
    client lending its model (it answers "first", then "again") whose ``_ASK`` was answered
    once, the process, and what the process logged."""
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"memory": {"store": "sqlite", "path": str(memory)}},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
        }
        replies = [said("first"), said("again")]
        async with (
            _piped_log() as (log, output),
            gateway_child(config, tmp_path, log) as (base, child),
            sampling_client(f"{base}/mcp", "legacy", replies, []) as c,
        ):
            assert text_of(await c.call_tool("ask_agent", _ASK)) == "first"
            yield c, child, output


async def test_a_memory_that_cannot_be_written_fails_the_run_in_one_line(tmp_path: Path) -> None:
    # Each run logged a traceback, as a bug would, and answered with SQLite's bare error.
    memory = tmp_path / "state" / "conversations.sqlite"
    async with _answered_once(tmp_path, memory) as (c, child, output):
        _limit(child, 512)
        failed = await c.call_tool("ask_agent", _ASK)
        _limit(child, None)
        assert text_of(await c.call_tool("ask_agent", _ASK)) == "again"
    assert failed.is_error
    assert f"the conversation memory {memory} cannot be written: " in text_of(failed)
    said_ = b"".join(output).decode()
    assert "Traceback" not in said_
    assert f"failed: the conversation memory {memory} cannot be written" in said_


async def test_a_memory_another_process_holds_locked_fails_the_run_in_one_line(tmp_path: Path) -> None:
    # A backup or a sqlite3 shell holding the file's write lock: each run logged two ERROR
    # tracebacks (the run's, its compaction's), as a bug would, and answered "the agent run
    # failed: OperationalError: database is locked".
    memory = tmp_path / "conversations.sqlite"
    async with _answered_once(tmp_path, memory) as (c, _, output):
        other = sqlite3.connect(memory, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            failed = await c.call_tool("ask_agent", {**_ASK, "conversation_id": "new"})
        finally:
            other.close()
        assert text_of(await c.call_tool("ask_agent", _ASK)) == "again"
    assert failed.is_error
    assert f"the conversation memory {memory} cannot be written: database is locked" in text_of(failed)
    said_ = b"".join(output).decode()
    assert "Traceback" not in said_
    # The run's own line (the call's access line cuts its detail at 256 characters: under
    # pytest-xdist, this path took the end of it).
    ended = [line for line in said_.splitlines() if "agent_gateway.agent.runner: agent run" in line]
    assert any(
        " failed: " in line
        and line.endswith(f"the conversation memory {memory} cannot be written: database is locked")
        for line in ended
    ), ended


async def test_a_memory_deleted_under_the_gateway_is_announced(tmp_path: Path) -> None:
    # Runs went on in the unlinked file, lost at the next start, and nothing said so.
    memory = tmp_path / "conversations.sqlite"
    async with _answered_once(tmp_path, memory) as (c, _, output):
        memory.unlink()
        assert text_of(await c.call_tool("ask_agent", _ASK)) == "again"
        await _until(lambda: b"was deleted while the gateway runs" in b"".join(output))
    said_ = b"".join(output).decode()
    warned = [line for line in said_.splitlines() if "was deleted while the gateway runs" in line]
    assert len(warned) == 1
    assert f"WARNING agent_gateway.agent.memory: conversation memory {memory}" in warned[0]


async def test_audit_required_refuses_calls_while_the_trail_cannot_be_written(tmp_path: Path) -> None:
    # For a deployment where no call may go unaudited: without the knob, calls are served
    # (and their records wait, or are counted lost) while the disk is full.
    trail = tmp_path / "audit.jsonl"
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"enabled": False},
            "audit": {"path": str(trail), "required": True},
        }
        async with (
            gateway_child(config, tmp_path) as (base, child),
            Client(f"{base}/mcp") as c,
            httpx.AsyncClient(timeout=BOUND) as http,
        ):
            assert not (await c.call_tool("desk__echo", {"text": "before"})).is_error
            await _until(lambda: len(_written(trail)) == 1)
            _limit(child, trail.stat().st_size)
            assert not (await c.call_tool("desk__echo", {"text": "unwritten"})).is_error  # found out here
            await _until_unready(http, base)
            with pytest.raises(MCPError) as refused:
                await c.call_tool("desk__echo", {"text": "refused"})
            _limit(child, None)
            with anyio.fail_after(BOUND):
                while (await http.get(f"{base}/readyz")).status_code != 200:
                    await anyio.sleep(0.05)
            assert not (await c.call_tool("desk__echo", {"text": "after"})).is_error
    assert refused.value.error.message == (
        f"not served: the audit trail cannot be written ({trail}: File too large) (audit.required)"
    )
    assert main(["audit", "verify", str(trail)]) == 0


async def test_audit_required_refuses_an_agent_runs_call_while_the_trail_cannot_be_written(
    tmp_path: Path,
) -> None:
    # The run was admitted while the trail could be written; its tool call, made once the disk
    # had filled, went to the upstream unaudited (the check was at the run's start only).
    trail = tmp_path / "audit.jsonl"
    seen: list[types.CreateMessageRequestParams] = []
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"memory": {"store": "memory"}},
            "audit": {"path": str(trail), "required": True},
        }
        async with (
            gateway_child(config, tmp_path) as (base, child),
            Client(f"{base}/mcp") as other,
            httpx.AsyncClient(timeout=BOUND) as http,
        ):

            async def fill_the_disk_then_call(
                context: ClientRequestContext, params: types.CreateMessageRequestParams
            ) -> types.CreateMessageResultWithTools:
                seen.append(params)
                if len(seen) > 1:
                    return types.CreateMessageResultWithTools(
                        role="assistant", content=[types.TextContent(type="text", text="done")], model="m"
                    )
                _limit(child, trail.stat().st_size)
                assert not (await other.call_tool("desk__echo", {"text": "unwritten"})).is_error
                await _until_unready(http, base)
                use = types.ToolUseContent(id="t1", name="desk__echo", input={"text": "by the agent"})
                return types.CreateMessageResultWithTools(
                    role="assistant", content=[use], model="m", stop_reason="toolUse"
                )

            sampling = types.SamplingCapability(tools=types.SamplingToolsCapability())
            async with Client(  # a handshake-era client, sampled within the run's request
                f"{base}/mcp",
                mode="legacy",
                sampling_callback=fill_the_disk_then_call,
                sampling_capabilities=sampling,
            ) as c:
                assert not (await c.call_tool("desk__echo", {"text": "before"})).is_error
                await _until(lambda: len(_written(trail)) == 1)
                ran = await c.call_tool("ask_agent", {"query": "echo it"})
            _limit(child, None)
    assert not ran.is_error
    told = seen[1].messages[-1].content_as_list[0]
    assert isinstance(told, types.ToolResultContent)
    assert told.is_error
    assert told.content == [
        types.TextContent(
            type="text",
            text=f"not served: the audit trail cannot be written ({trail}: File too large) (audit.required)",
        )
    ]
    # Its record, written once the disk had room, says so.
    by_the_run = [(r["name"], r["outcome"]) for r in records(trail) if r.get("run")]
    assert by_the_run == [("desk__echo", "refused")]


def _opened(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if _target(fd) == str(path))


def _target(fd: Path) -> str | None:
    try:
        return os.readlink(fd)
    except OSError:  # closed meanwhile
        return None


async def test_a_memory_file_that_is_no_database_fails_each_run_and_keeps_no_connection(
    tmp_path: Path,
) -> None:
    # Its connection was kept on the store's stack though the store never opened: each run
    # opened another, and left it (its file open, its thread) behind until the gateway stopped.
    memory = tmp_path / "conversations.sqlite"
    memory.write_bytes(b"a log written over the memory " * 200)
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"memory": {"store": "sqlite", "path": str(memory)}},
        }
        async with running_gateway(config) as gw, Client(gw.url, mode="legacy") as client:
            failed = await client.call_tool("ask_agent", _ASK)
            for _ in range(5):
                assert (await client.call_tool("ask_agent", _ASK)).is_error
            assert _opened(memory) == 0
    assert failed.is_error
    assert f"conversation memory {memory}: cannot open the SQLite file: file is not a database" in text_of(
        failed
    )
