"""Tool pins in the shared Postgres (issue 19): a tool one replica pinned is held by another
that only ever saw it changed, ``pins accept`` is said once for every replica, and replicas
starting together against an empty database make the table once."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any, LiteralString

import anyio
import psycopg
import pytest
import yaml
from mcp import Client

from agent_gateway import pins_postgres
from agent_gateway.cli import main
from agent_gateway.pins_postgres import SharedPins
from agent_gateway.reload import apply
from agent_gateway.shown_urls import without_password
from tests.replicas.services import Postgres, postgres_server
from tests.security.test_pinning import RUG, listed
from tests.support import running_gateway, serving_upstream
from tests.test_search_mode import tracker_server


def shared_config(home: Path, url: str, database: str) -> dict[str, Any]:
    config = {
        "upstreams": {"tracker": {"url": url}},
        "agent": {"memory": {"store": "postgres", "url": database}},
        "search": {"mode": "off"},
    }
    (home / "gateway.yaml").write_text(yaml.safe_dump(config))
    return config


async def test_a_tool_another_replica_pinned_is_held_here_once_changed_and_accepted_once_for_all(
    tmp_path: Path, database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "gateway.yaml")
    async with serving_upstream(tracker_server([])) as url:
        config = shared_config(tmp_path, url, database)
        async with running_gateway(config) as first:  # replica A pins what it sees
            assert "tracker__close_issue" in first.gateway.catalog.snapshot.tools
        async with Client(url) as direct:  # then the upstream changes a tool's description
            await direct.call_tool("describe_tool", RUG)
        # Replica B never saw the original: it holds the change because A's pin is shared.
        async with running_gateway(config) as second, Client(second.url) as client:
            assert "tracker__close_issue" not in await listed(client)
            assert "tracker__delete_project" in await listed(client)
            await written_through(database, "pending_digest IS NOT NULL")  # B's flag, by its writer
            capsys.readouterr()
            assert main(["pins", "list", "-c", path]) == 0
            shown = capsys.readouterr().out
            assert without_password(database) in shown  # the database, its password not shown
            assert "tracker__close_issue" in shown
            assert "CHANGED (description" in shown
            assert main(["pins", "accept", "-c", path, "tracker__close_issue"]) == 0
            capsys.readouterr()
            # A name with nothing pending (or mistyped) accepts nothing: said, and the command fails.
            assert main(["pins", "accept", "-c", path, "tracker__delete_project"]) == 1
            assert capsys.readouterr().out == "tracker__delete_project: no pending change\n"
            await apply(second.gateway, second.gateway.config)  # what SIGHUP does
            assert "tracker__close_issue" in await listed(client)
    # The far end: the database holds the accepted definition, nothing pending.
    async with await psycopg.AsyncConnection.connect(database) as conn:
        rows = await (
            await conn.execute(
                "SELECT definition, pending_digest FROM agent_gateway_pins WHERE name = 'tracker__close_issue'"
            )
        ).fetchall()
    [(definition, pending)] = rows
    assert RUG["description"] in definition
    assert pending is None


async def written_through(database: str, condition: LiteralString) -> None:
    """Until a row of the shared table meets ``condition`` (the writer works behind)."""
    async with await psycopg.AsyncConnection.connect(database) as conn:
        with anyio.fail_after(10):
            while not await (
                await conn.execute("SELECT 1 FROM agent_gateway_pins WHERE " + condition)
            ).fetchone():
                await anyio.sleep(0.02)


async def test_replicas_starting_together_make_the_pins_table_once_and_write_through(database: str) -> None:
    errors: list[BaseException] = []

    async def replica(n: int) -> None:
        try:
            async with SharedPins(database).running() as shared:
                shared.write("pin", ("source", f"tool_{n}", "up", "digest", "{}", float(n)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            raise

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(replica, n)
    assert errors == []
    async with await psycopg.AsyncConnection.connect(database) as conn:
        names = await (await conn.execute("SELECT name FROM agent_gateway_pins ORDER BY name")).fetchall()
    assert [n for (n,) in names] == ["tool_0", "tool_1", "tool_2", "tool_3"]


async def test_a_tool_pinned_by_two_replicas_keeps_the_first_ones_definition(database: str) -> None:
    # Two replicas pinning a new tool, the upstream changing it in between: the second's pin,
    # arriving once the first's row exists, must not replace it, or the change is pinned as the
    # original and served unheld (the first replica's copy follows the database at its next
    # reload).
    for digest in ("first", "second"):
        async with SharedPins(database).running() as shared:
            shared.write("pin", ("source", "tool", "up", digest, f'{{"v": "{digest}"}}', 0.0))
    async with await psycopg.AsyncConnection.connect(database) as conn:
        rows = await (await conn.execute("SELECT digest, definition FROM agent_gateway_pins")).fetchall()
    assert rows == [("first", '{"v": "first"}')]


async def pending_of(url: str, name: str) -> str | None:
    """The pending digest the database holds for ``name`` (None: none, or no row)."""
    try:
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=2) as conn:
            cursor = await conn.execute(
                "SELECT pending_digest FROM agent_gateway_pins WHERE name = %s", (name,)
            )
            row = await cursor.fetchone()
    except psycopg.OperationalError:  # the server not (yet) up
        return None
    return row[0] if row is not None else None


async def test_a_tools_changes_while_the_database_is_down_are_written_as_the_last_once_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An upstream rewriting its tools at every listing while Postgres is away: before, each
    # change was queued whole (10,000 at most), the rest dropped with an ERROR line each, and
    # the tool's last change was never written (the database held a stale one for good).
    with postgres_server() as server:
        async with SharedPins(server.url).running() as shared:
            shared.write("pin", ("source", "t0", "up", "d0", "{}", 0.0))
            with anyio.fail_after(20):
                while not await _pinned(server.url):
                    await anyio.sleep(0.05)
            server.stop()
            for version in range(1, 12_001):
                shared.write("flag", (f"d{version}", f'{{"v": {version}}}', "description", "source", "t0"))
            server.start()
            with anyio.fail_after(20):
                while await pending_of(server.url, "t0") != "d12000":
                    await anyio.sleep(0.1)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) <= 1, errors[:3]  # "cannot write a tool pin (…); retrying", once


async def _pinned(url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (
            await conn.execute("SELECT count(*) FROM agent_gateway_pins WHERE name = 't0'")
        ).fetchone()
    return row is not None and row[0] == 1


def _postgres_processes(server: Postgres) -> list[int]:
    """The cluster's postmaster and its backends (this test's own cluster)."""
    postmaster = int((server.directory / "data" / "postmaster.pid").read_text().split()[0])
    children = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _parent_of(entry) == postmaster
    ]
    return [postmaster, *children]


def _continue_wrapper(server: Postgres) -> None:
    """``runuser`` (the cluster's parent as root) stops itself when the postmaster stops and
    waits for a SIGCONT of its own: left stopped, it ignored the SIGTERM of the cluster's stop
    until its 10 s bound ran out and it was killed."""
    if server.process is not None:
        server.process.send_signal(signal.SIGCONT)


def _parent_of(entry: Path) -> int | None:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


async def test_a_reload_while_the_database_does_not_answer_keeps_this_replicas_copy_within_a_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database frozen (a partition, a hung host: connections open, nothing answered).
    # Before, a reload's read of the pins waited for ever, and with it the reload.
    monkeypatch.setattr(pins_postgres, "_ANSWER_BOUND", 2.0)  # the bound, not its 10 s, is tested
    with postgres_server() as server:
        async with serving_upstream(tracker_server([])) as url:
            config = shared_config(tmp_path, url, server.url)
            async with running_gateway(config) as gw, Client(gw.url) as client:
                frozen = _postgres_processes(server)
                for pid in frozen:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    with anyio.fail_after(30):
                        await apply(gw.gateway, gw.gateway.config)  # what SIGHUP does
                    assert "tracker__close_issue" in await listed(client)  # served from its copy
                finally:
                    for pid in frozen:
                        os.kill(pid, signal.SIGCONT)
                    _continue_wrapper(server)
    kept = [r.getMessage() for r in caplog.records if "copy kept" in r.getMessage()]
    assert kept, "the reload said it kept this replica's copy"
    assert "did not answer within" in kept[0]
