"""The audit trail (issue 16): one hash-chained record per call and agent run, written off the
event loop; ``agent-gateway audit verify`` finds an edited, inserted or deleted record."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from mcp import Client

from agent_gateway.activity import Activity, Call, cut
from agent_gateway.audit import QUEUED_BYTES, AuditLog
from agent_gateway.call_records import CallRecorder, RunCall
from agent_gateway.cli import main
from agent_gateway.config import AuditConfig
from tests.agent.scripted import ScriptedChatModel, answer, call, calls
from tests.security.test_hostile_load import ATTACKER_TOKEN, BYSTANDER_TOKEN, bearer, client
from tests.servers import recorder
from tests.support import (
    RunningGateway,
    gateway_child,
    gateway_env,
    python_upstream,
    running_gateway,
    serving_upstream,
)

BOUND = 30.0


def _server() -> FastMCP:
    server = FastMCP("desk")

    @server.tool
    def echo(text: str) -> str:
        return text

    @server.tool
    def fail() -> str:
        raise ToolError("out of paper")

    @server.prompt
    def brief(topic: str) -> str:
        return f"Brief me on {topic}."

    @server.resource("memo://today")
    def today() -> str:
        return "all quiet"

    return server


@asynccontextmanager
async def audited(
    path: Path, limits: dict[str, Any] | None = None, model: ScriptedChatModel | None = None, **audit: Any
) -> AsyncIterator[RunningGateway]:
    model = model or ScriptedChatModel(respond=lambda messages: answer("done"))
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"memory": {"store": "memory"}},
            "audit": {"path": str(path)} | audit,
        } | bearer(
            {
                "tools": ["desk__echo"],
                "prompts": [],
                "resources": [],
                **(limits or {}),
            }
        )
        environ = {"B": BYSTANDER_TOKEN, "A": ATTACKER_TOKEN}
        async with running_gateway(config, environ=environ, chat_model=model) as gw:
            yield gw


async def test_a_trail_left_readable_by_others_is_made_private_and_written_on(tmp_path: Path) -> None:
    # A trail an older release or a copy left 0644 holds every client's actions: made 0600 at
    # start-up, not only when created.
    trail = tmp_path / "trail" / "audit.jsonl"
    trail.parent.mkdir(mode=0o700)
    trail.touch(mode=0o644)
    os.chmod(trail, 0o644)
    async with audited(trail) as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        assert stat.S_IMODE(trail.stat().st_mode) == 0o600
        await c.call_tool("desk__echo", {"text": "hi"})
    assert [r["name"] for r in records(trail)] == ["desk__echo"]
    assert main(["audit", "verify", str(trail)]) == 0


def records(path: Path) -> list[dict[str, Any]]:
    """The trail's records, but a last line still being written (read while the gateway runs)."""
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


async def test_every_call_and_agent_run_is_one_record_with_who_what_and_how_it_ended(tmp_path: Path) -> None:
    trail = tmp_path / "trail" / "audit.jsonl"
    async with audited(trail) as gw:
        async with client(gw.url, BYSTANDER_TOKEN) as c:
            await c.call_tool("desk__echo", {"text": "hi"})
            await c.call_tool("desk__fail", {})
            await c.get_prompt("desk__brief", {"topic": "audits"})
            await c.read_resource("memo://today")
            await c.call_tool("ask_agent", {"query": "anything?"})
        async with client(gw.url, ATTACKER_TOKEN) as restricted:
            assert (await restricted.call_tool("desk__fail", {})).is_error
    kept = records(trail)
    assert [(r["client"], r["method"], r["name"], r["outcome"]) for r in kept] == [
        ("bystander", "tools/call", "desk__echo", "ok"),
        ("bystander", "tools/call", "desk__fail", "tool_error"),
        ("bystander", "prompts/get", "desk__brief", "ok"),
        ("bystander", "resources/read", "memo://today", "ok"),
        ("bystander", "tools/call", "ask_agent", "ok"),
        ("attacker", "tools/call", "desk__fail", "refused"),
    ]
    first = kept[0]
    assert first["upstream"] == "desk"
    assert "session" in first  # None in the modern era, where a request is its own session
    assert "trace_id" in first  # the span's, when tracing is installed (tests/test_observability.py)
    assert first["duration_ms"] >= 0
    assert first["arguments_sha256"] == hashlib.sha256(b'{"text":"hi"}').hexdigest()
    assert "arguments" not in first
    assert "out of paper" in kept[1]["detail"]
    assert "not allowed" in kept[5]["detail"]
    assert [r["seq"] for r in kept] == list(range(1, 7))
    assert stat.S_IMODE(trail.stat().st_mode) == 0o600
    assert stat.S_IMODE(trail.parent.stat().st_mode) == 0o700
    assert main(["audit", "verify", str(trail)]) == 0


async def test_an_agent_runs_tool_calls_are_its_clients_records_with_the_runs_id(tmp_path: Path) -> None:
    # Only the ask_agent call was recorded: the tools a run called on upstreams for the
    # client (a model a prompt injection steers among them) were in no trail.
    trail = tmp_path / "audit.jsonl"
    model = ScriptedChatModel(
        script=[calls(call("desk__echo", text="ran")), calls(call("desk__fail")), answer("done")]
    )
    policy = {"tools": ["desk__echo", "desk__fail", "ask_agent"]}
    async with audited(trail, policy, model, arguments="full") as gw, client(gw.url, ATTACKER_TOKEN) as c:
        result = await c.call_tool("ask_agent", {"query": "echo it"})
    assert not result.is_error
    assert result.structured_content is not None
    run = result.structured_content["run_id"]
    kept = records(trail)
    assert [(r["client"], r["name"], r["upstream"], r["outcome"], r.get("run")) for r in kept] == [
        ("attacker", "desk__echo", "desk", "ok", run),
        ("attacker", "desk__fail", "desk", "tool_error", run),
        ("attacker", "ask_agent", None, "ok", None),
    ]
    assert kept[0]["arguments"] == {"text": "ran"}
    assert kept[0]["arguments_sha256"] == hashlib.sha256(b'{"text":"ran"}').hexdigest()
    assert "out of paper" in kept[1]["detail"]
    assert kept[0]["session"] == kept[2]["session"]  # None in the modern era
    assert main(["audit", "verify", str(trail)]) == 0


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # "auto": the run pauses to ask, then resumes
async def test_an_agent_runs_call_its_user_declined_is_a_refused_record_and_an_approved_one_is_one(
    tmp_path: Path, mode: str
) -> None:
    # A call the run proposed and the user refused (or no one could be asked) was in no trail:
    # a prompt injection's attempt at a tool that needs approval went unrecorded. And the
    # approved call, run once the paused run resumed, is recorded once.
    trail = tmp_path / "audit.jsonl"
    model = ScriptedChatModel(
        script=[
            calls(call("desk__echo", text="wipe")),
            calls(call("desk__echo", text="fine")),
            answer("done"),
        ]
    )
    asked: list[str] = []

    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if len(asked) == 1:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"approve": True})

    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"memory": {"store": "memory"}, "require_approval": ["desk__echo"]},
            "audit": {"path": str(trail), "arguments": "full"},
        }
        async with (
            running_gateway(config, chat_model=model) as gw,
            Client(gw.url, mode=mode, elicitation_callback=user) as c,
        ):
            result = await c.call_tool("ask_agent", {"query": "echo it"})
    assert not result.is_error
    assert len(asked) == 2
    by_the_run = [r for r in records(trail) if r.get("run")]
    assert [(r["name"], r["arguments"], r["outcome"]) for r in by_the_run] == [
        ("desk__echo", {"text": "wipe"}, "refused"),
        ("desk__echo", {"text": "fine"}, "ok"),
    ]
    assert "declined to run desk__echo" in by_the_run[0]["detail"]
    assert main(["audit", "verify", str(trail)]) == 0


async def test_an_agent_runs_call_whose_upstream_asks_for_input_is_no_paused_record(tmp_path: Path) -> None:
    # A modern client's run: the upstream's question comes back to the run as an
    # InputRequiredResult no one answers. It was recorded "paused", a call never resumed.
    trail = tmp_path / "audit.jsonl"
    server = recorder.build(lambda event: None)  # its "ask" returns an InputRequiredResult

    model = ScriptedChatModel(script=[calls(call("desk__ask", question="name?")), answer("done")])
    async with serving_upstream(server) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"memory": {"store": "memory"}},
            "audit": {"path": str(trail)},
        }
        async with running_gateway(config, chat_model=model) as gw, Client(gw.url, mode="auto") as c:
            result = await c.call_tool("ask_agent", {"query": "ask"})
    assert not result.is_error
    by_the_run = [r for r in records(trail) if r.get("run")]
    assert [(r["name"], r["outcome"]) for r in by_the_run] == [("desk__ask", "tool_error")]
    assert "asked for input from the user" in by_the_run[0]["detail"]


async def test_full_arguments_rotation_and_a_chain_that_survives_restarts(tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    for _ in range(2):
        async with (
            audited(trail, arguments="full", max_bytes=4096, keep=50) as gw,
            client(gw.url, BYSTANDER_TOKEN) as c,
        ):
            for n in range(20):
                await c.call_tool("desk__echo", {"text": f"call {n}"})
    rotated = sorted(tmp_path.glob("audit.jsonl.*"), key=lambda p: -int(p.suffix[1:]))  # noqa: ASYNC240
    assert len(rotated) >= 2
    files = [*rotated, trail]
    kept = [r for f in files for r in records(f)]
    assert [r["seq"] for r in kept] == list(range(1, 41))
    assert kept[-1]["arguments"] == {"text": "call 19"}
    assert main(["audit", "verify", *map(str, files)]) == 0


async def test_arguments_kept_in_the_trail_are_never_in_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # audit.arguments: full keeps what the client sent in the trail, a 0600 file; the access
    # line (its text and its structured fields, which the JSON log format writes) names the
    # call and its digest only, for logs are read and shipped more widely.
    caplog.set_level(logging.INFO, logger="agent_gateway.calls")
    said = "the client's password is hunter2-0123"
    trail = tmp_path / "audit.jsonl"
    async with audited(trail, arguments="full") as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        await c.call_tool("desk__echo", {"text": said})
    assert [r["arguments"] for r in records(trail)] == [{"text": said}]
    lines = [r for r in caplog.records if r.name == "agent_gateway.calls"]
    assert len(lines) == 1
    assert said not in lines[0].getMessage()
    assert said not in json.dumps(lines[0].fields)  # type: ignore[attr-defined]


async def test_a_record_holding_unicode_line_breaks_stays_one_line_and_verifies(tmp_path: Path) -> None:
    # str.splitlines (and log shippers built on it) end a line at U+2028, U+2029 and U+0085,
    # which json.dumps leaves raw: one record read as three, none of them JSON.
    said = "a\u2028b\x85c\u2029d \u202eevil"
    trail = tmp_path / "audit.jsonl"
    async with audited(trail, arguments="full") as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        await c.call_tool("desk__echo", {"text": said})
        await c.call_tool("desk__echo", {"text": "after"})
    kept = records(trail)  # one record a line, by str.splitlines
    assert [r["arguments"]["text"] for r in kept] == [said, "after"]
    assert not any(ch in trail.read_text() for ch in "\u2028\u2029\x85\u202e")
    assert main(["audit", "verify", str(trail)]) == 0


def _tampered(source: Path, target: Path, change: Any) -> Path:
    lines = source.read_text().splitlines(keepends=True)
    target.write_text("".join(change(lines)))
    return target


async def test_a_trail_torn_mid_record_by_a_crash_goes_on_from_its_last_whole_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A record cut mid-write (the process killed, the disk full) ended every later start of
    # the gateway with a JSONDecodeError traceback; the next record would have been glued to it.
    trail = tmp_path / "audit.jsonl"
    async with audited(trail) as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        for n in range(2):
            await c.call_tool("desk__echo", {"text": str(n)})
    whole = trail.read_bytes()
    trail.write_bytes(whole + whole.splitlines()[-1][:30])  # no line break after it
    async with audited(trail) as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        await c.call_tool("desk__echo", {"text": "after"})
    _, second, torn, after = trail.read_text().splitlines()
    assert torn == whole.splitlines()[-1][:30].decode()
    assert json.loads(after)["seq"] == 3
    assert json.loads(after)["prev"] == json.loads(second)["hash"]
    capsys.readouterr()
    assert main(["audit", "verify", str(trail)]) == 1  # the torn line is named, as it must be
    assert f"{trail}:3:" in capsys.readouterr().out


def test_a_trail_that_cannot_be_opened_refuses_the_start_in_one_line(tmp_path: Path) -> None:
    # Its OSError ended the start-up with ten nested exception groups and no "error:" line.
    (tmp_path / "state").write_text("a file where the trail's directory should be")
    config = tmp_path / "gateway.yaml"
    data = {
        "server": {"port": 0},
        "upstreams": {"desk": python_upstream("counter.py")},
        "agent": {"enabled": False},
        "audit": {"path": str(tmp_path / "state" / "audit.jsonl")},
    }
    config.write_text(json.dumps(data))
    agent_gateway = str(Path(sys.executable).parent / "agent-gateway")
    refused = subprocess.run(
        [agent_gateway, "serve", "-c", str(config)],
        capture_output=True,
        text=True,
        env=gateway_env(),
        timeout=120,
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"error: audit.path: cannot open {tmp_path / 'state' / 'audit.jsonl'}: File exists"
    )
    assert "Traceback" not in refused.stderr


async def test_verify_names_the_first_edited_inserted_or_deleted_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trail = tmp_path / "audit.jsonl"
    async with audited(trail) as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        for n in range(5):
            await c.call_tool("desk__echo", {"text": str(n)})
    capsys.readouterr()

    def edit(lines: list[str]) -> list[str]:
        return [*lines[:2], lines[2].replace('"client":"bystander"', '"client":"someone"'), *lines[3:]]

    def insert(lines: list[str]) -> list[str]:
        return [*lines[:3], lines[1], *lines[3:]]

    def delete(lines: list[str]) -> list[str]:
        return [*lines[:1], *lines[2:]]

    cases = {
        "edited": (edit, ":3: edited"),
        "inserted": (insert, ":4: does not follow"),
        "deleted": (delete, ":2: does not follow"),
    }
    for name, (change, expected) in cases.items():
        bad = _tampered(trail, tmp_path / f"{name}.jsonl", change)
        assert main(["audit", "verify", str(bad)]) == 1, name
        assert expected in capsys.readouterr().out, name


def test_verify_of_a_file_that_cannot_be_read_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (tmp_path / "nope.jsonl", tmp_path):  # missing; a directory
        assert main(["audit", "verify", str(path)]) == 1
        out = capsys.readouterr().out
        assert (
            out
            == f"BROKEN after 0 good records: {path}: cannot be read ({'No such file or directory' if path != tmp_path else 'Is a directory'})\n"
        )


async def test_two_gateways_on_one_trail_each_keep_a_whole_chain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As two IDEs each launching a gateway on the same config: the second writes beside it.
    caplog.set_level(logging.INFO, "agent_gateway")
    trail = tmp_path / "audit.jsonl"
    async with (
        audited(trail) as first,
        audited(trail) as second,
        client(first.url, BYSTANDER_TOKEN) as one,
        client(second.url, BYSTANDER_TOKEN) as two,
    ):
        for n in range(3):
            await one.call_tool("desk__echo", {"text": f"one {n}"})
            await two.call_tool("desk__echo", {"text": f"two {n}"})
    [beside] = list(tmp_path.glob("audit.*.jsonl"))  # noqa: ASYNC240 (the gateways have stopped)
    assert beside != trail
    for path in (trail, beside):
        assert [r["seq"] for r in records(path)] == [1, 2, 3], path
        assert main(["audit", "verify", str(path)]) == 0, path
    assert f"this one writes {beside}" in caplog.text


async def test_a_second_gateway_on_one_trail_that_records_nothing_leaves_no_file_beside_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As a stdio gateway an IDE starts beside a serving one, and no call goes through it.
    caplog.set_level(logging.INFO, "agent_gateway")
    trail = tmp_path / "audit.jsonl"
    async with audited(trail) as first, client(first.url, BYSTANDER_TOKEN) as one:
        async with audited(trail):
            [beside] = list(tmp_path.glob("audit.*.jsonl"))  # noqa: ASYNC240 (a name, no I/O to wait on)
            [said] = [r for r in caplog.records if "this one writes" in r.getMessage()]
        await one.call_tool("desk__echo", {"text": "one"})
    assert sorted(p.name for p in tmp_path.iterdir() if "audit" in p.name) == [  # noqa: ASYNC240 (stopped)
        ".audit.jsonl.lock",
        "audit.jsonl",
    ]
    assert not beside.exists()
    assert said.levelno == logging.INFO  # as meant: two processes, two files
    assert [r["seq"] for r in records(trail)] == [1]


async def test_a_call_through_call_tool_is_recorded_as_the_tool_it_called(tmp_path: Path) -> None:
    """In search mode nearly every call goes through ``call_tool``: its record must name the
    tool that ran, its upstream and its arguments' digest, as the direct call's does."""
    trail = tmp_path / "audit.jsonl"
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "search": {"mode": "on"},
            "audit": {"path": str(trail)},
        }
        async with running_gateway(config) as gw, Client(gw.url) as direct:
            await direct.call_tool("desk__echo", {"text": "hi"})
            await direct.call_tool("call_tool", {"name": "desk__echo", "arguments": {"text": "hi"}})
    calls = [
        (r["name"], r["upstream"], r["arguments_sha256"])
        for r in records(trail)
        if r["method"] == "tools/call"
    ]
    assert len(calls) == 2
    assert calls[0][:2] == ("desk__echo", "desk")
    assert calls[1] == calls[0]


async def test_a_clients_refusals_are_one_record_a_second_and_its_session_header_is_cut(
    tmp_path: Path,
) -> None:
    # Refused before a byte was parsed, each was a record, with the Mcp-Session-Id header the
    # client sent: 60,000 characters each, 285 MB in 20 s rotated every earlier record out.
    trail = tmp_path / "audit.jsonl"
    limited = {"rate_limit": {"per_minute": 60, "burst": 1}}
    async with audited(trail, limited) as gw, httpx.AsyncClient(timeout=BOUND) as http:
        headers = {
            "Authorization": f"Bearer {ATTACKER_TOKEN}",
            "Accept": "application/json, text/event-stream",
            "Mcp-Session-Id": "s" * 60_000,
        }
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "desk__echo"}}
        sent, refused = 0, []
        with anyio.fail_after(BOUND):
            while not any("more like it from this client" in r["detail"] for r in refused):
                answer = await http.post(gw.url, json=call, headers=headers)
                assert answer.status_code in (404, 429)  # 404: within its rate, no such session
                sent += answer.status_code == 429
                refused = [r for r in records(trail) if r["outcome"] == "refused"] if trail.exists() else []
    assert len(refused) < sent
    assert all(len(r["session"]) <= 64 for r in refused)
    assert main(["audit", "verify", str(trail)]) == 0


async def test_full_arguments_past_64_kib_are_kept_as_their_size_and_digest(tmp_path: Path) -> None:
    # 16 calls of 3.5 MB held 1.3 GB in the writer's queue, and files overshot max_bytes.
    trail = tmp_path / "audit.jsonl"
    text = "x" * 100_000
    async with audited(trail, arguments="full") as gw, client(gw.url, BYSTANDER_TOKEN) as c:
        await c.call_tool("desk__echo", {"text": text})
        await c.call_tool("desk__echo", {"text": "short"})
    first, second = [r for r in records(trail) if r["name"] == "desk__echo"]
    whole = json.dumps({"text": text}, sort_keys=True, separators=(",", ":"))
    assert first["arguments"] == {"cut": f"{len(whole):,} characters"}
    assert first["arguments_sha256"] == hashlib.sha256(whole.encode()).hexdigest()
    assert second["arguments"] == {"text": "short"}


async def test_a_gateway_whose_audit_disk_hangs_still_stops(tmp_path: Path) -> None:
    # A FIFO nobody reads stands in for a hung mount: opening it to write never returns. The
    # write ran in anyio's worker thread, which the interpreter waits for: SIGTERM never
    # stopped the gateway.
    hung = tmp_path / "hung" / "audit.jsonl"
    hung.parent.mkdir()
    os.mkfifo(hung)
    async with serving_upstream(_server()) as url:
        config = {
            "upstreams": {"desk": {"url": url}},
            "agent": {"enabled": False},
            "audit": {"path": str(hung)},
        }
        async with gateway_child(config, tmp_path) as (base, child), client(f"{base}/mcp") as c:
            assert not (await c.call_tool("desk__echo", {"text": "x"})).is_error
            child.send_signal(signal.SIGTERM)
            with anyio.fail_after(BOUND):
                while child.poll() is None:
                    await anyio.sleep(0.05)
    assert child.returncode == 0


async def test_full_arguments_waiting_for_the_writer_are_bounded_in_bytes(tmp_path: Path) -> None:
    # Bounded by count alone (10,000 records), 16 calls of 3.5 MB at once held 1.3 GB.
    trail = tmp_path / "audit.jsonl"
    log = AuditLog(AuditConfig(path=str(trail), arguments="full"))
    kept = {"text": "x" * 1000}
    call = Call(
        1.0, "ci", None, None, "tools/call", "desk__echo", "desk", "ok", None, 0.1, None, None, kept, 1 << 20
    )
    dropped = -1
    async with anyio.create_task_group() as tg:
        await tg.start(log.run)
        for _ in range(100):  # no await between: the writer takes none meanwhile
            log.record(call)
        dropped = log.dropped
        tg.cancel_scope.cancel()  # what is queued is written on the way out
    assert dropped == 100 - QUEUED_BYTES // (1 << 20)
    gap, *kept_records = records(trail)  # the trail says what it lacks, first
    assert (gap["method"], gap["lost"]) == ("audit/gap", dropped)
    assert len(kept_records) == QUEUED_BYTES // (1 << 20)


LEAKED = "sk-upstream-0123456789abcdef"


async def test_an_upstreams_error_result_quoting_its_credential_is_recorded_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An upstream's JSON-RPC error is scrubbed where it is translated; a tool's error *result*
    # (isError) is the upstream's text too, and before went whole into the record's detail,
    # the access log line and the status page's calls.
    server = FastMCP("vault")

    @server.tool
    def login() -> str:
        raise ToolError(f"invalid credentials: 'Bearer {LEAKED}'")

    @server.tool
    def echo(text: str) -> str:
        return text

    trail = tmp_path / "audit.jsonl"
    async with serving_upstream(server) as url:
        config = {
            "upstreams": {"vault": {"url": url, "headers": {"Authorization": f"Bearer {LEAKED}"}}},
            "audit": {"path": str(trail)},
        }
        async with (
            running_gateway(config) as gw,
            Client(gw.url, mode="legacy") as c,
            Client(gw.url, mode="legacy") as bystander,
            httpx.AsyncClient() as http,
        ):
            assert (await c.call_tool("vault__login", {})).is_error
            assert (await bystander.call_tool("vault__echo", {"text": "hi"})).content[0].text == "hi"  # type: ignore[union-attr]
            page = (await http.get(f"{gw.base}/")).text
    refused = next(r for r in records(trail) if r["name"] == "vault__login")
    assert refused["outcome"] == "tool_error"
    assert refused["detail"] == "invalid credentials: 'Bearer [redacted]'"
    assert "invalid credentials: &#x27;Bearer [redacted]&#x27;" in page
    assert LEAKED not in page
    assert not [r.getMessage() for r in caplog.records if LEAKED in r.getMessage()]


def test_a_records_detail_is_scrubbed_of_its_upstreams_credential_by_the_record_itself() -> None:
    # The upstream session takes the credential out of an error result before anyone sees it
    # (the test above, end to end); the record takes it out again of whatever detail reaches
    # it, so no path that skips the first (an agent run's call, a future one) puts it in the
    # trail, the log or the status page.
    activity = Activity()
    recorder = CallRecorder(activity, secrets=lambda upstream: (LEAKED,) if upstream == "vault" else ())
    quoted = types.CallToolResult(
        content=[types.TextContent(type="text", text=f"invalid credentials: 'Bearer {LEAKED}'")],
        is_error=True,
    )
    for upstream in ("vault", "other"):
        call = RunCall(
            run="r1", client=None, caller=None, name=f"{upstream}__login", upstream=upstream, arguments={}
        )
        with recorder.run_call(call) as record:
            record.answered(quoted)
    details = {c.name: c.detail for c in activity.calls}
    assert details == {
        "vault__login": "invalid credentials: 'Bearer [redacted]'",
        "other__login": f"invalid credentials: 'Bearer {LEAKED}'",  # not what "other" is sent
    }


def test_a_records_detail_is_cut_before_it_is_flattened() -> None:
    # An upstream's error result of 51 MB of short words, split whole into words to flatten it,
    # took the gateway from 0.3 to 1.45 GB (its memory, measured outside the test).
    words = "ab " * 2_000_000
    tracemalloc.start()
    try:
        detail = cut(words)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert detail == f"{('ab ' * 100)[:299]}…"
    assert peak < 1_000_000, peak  # before: 125 MB, a list of 2,000,000 words
    assert cut("a  b\n c") == "a b c"
    assert cut("x" * 300) == "x" * 300
    assert cut(" " * 5_000 + "late") == "…"
