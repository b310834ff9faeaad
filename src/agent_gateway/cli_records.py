"""``agent-gateway pins list | accept`` and ``agent-gateway audit verify``: the operator's
commands over what the gateway records (they work on the files, or the shared database, with
the gateway stopped or running). ``audit verify`` reads no configuration: it checks the files it is given."""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from agent_gateway.audit_verify import verify
from agent_gateway.config import GatewayConfig
from agent_gateway.errors import StoreUnavailable
from agent_gateway.pins import Pin, Pins, pins_path
from agent_gateway.shown_urls import without_password


def add_commands(commands: Any, config_arg: Any) -> None:
    """Register ``pins`` (and its subcommands) on the CLI's ``commands``."""
    pins = commands.add_parser("pins", help="list the pinned tools, or accept their changed definitions")
    actions = pins.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every pinned tool, and what changed in those held")
    config_arg(listing)
    listing.set_defaults(run=_pins_list)
    accept = actions.add_parser("accept", help="accept the changed definition of tools (serve them again)")
    config_arg(accept)
    accept.add_argument("names", nargs="*", metavar="NAME", help="public tool names")
    accept.add_argument("--all", action="store_true", help="every tool with a pending change")
    accept.set_defaults(run=_pins_accept)

    audit = commands.add_parser("audit", help="check the audit trail")
    checks = audit.add_subparsers(required=True, metavar="ACTION")
    check = checks.add_parser("verify", help="check the hash chain; name the first bad record")
    check.add_argument("files", nargs="+", metavar="FILE", type=Path, help="audit files, oldest first")
    check.set_defaults(run=_audit_verify, needs_config=False)


def _audit_verify(args: argparse.Namespace, config: GatewayConfig | None) -> int:
    verdict = verify(args.files)
    if verdict.problem is not None:
        print(f"BROKEN after {verdict.records} good records: {verdict.problem}")
        return 1
    print(f"intact: {verdict.records} records")
    return 0


def _shared_url(config: GatewayConfig) -> str | None:
    """The shared database the pins are in (``agent.memory.store: postgres``), else None."""
    memory = config.agent.memory
    return memory.url if memory.store == "postgres" else None


def _postgres() -> ModuleType:
    """The pins in Postgres, imported here only: psycopg takes ~0.1 s to load."""
    from agent_gateway import pins_postgres

    return pins_postgres


def _listed(config: GatewayConfig) -> list[Pin]:
    if (url := _shared_url(config)) is not None:
        return [Pin(*row) for row in _postgres().listed(url)]
    with _local_pins(config) as pins:
        return pins.pins()


def _accepted(config: GatewayConfig, names: list[str] | None) -> list[str]:
    if (url := _shared_url(config)) is not None:
        return _postgres().accepted(url, names)
    with _local_pins(config) as pins:
        return pins.accept(names)


@contextmanager
def _local_pins(config: GatewayConfig) -> Iterator[Pins]:
    """The pins file, closed after; one that is no database (or a directory, or unreadable) is
    said in one line, as an unreachable shared database is (it ended in a traceback)."""
    path = pins_path(config)
    pins = Pins(path, config.pinning)
    try:
        yield pins
    except (sqlite3.DatabaseError, OSError) as exc:
        raise StoreUnavailable(f"tool pins {path}: cannot be read: {exc}") from None
    finally:
        pins.close()


def _pins_list(args: argparse.Namespace, config: GatewayConfig) -> int:
    rows = _listed(config)
    where = without_password(url) if (url := _shared_url(config)) is not None else pins_path(config)
    print(f"{len(rows)} pinned tools in {where}")
    for pin in rows:
        seen = time.strftime("%Y-%m-%d %H:%M", time.localtime(pin.first_seen))
        state = f"CHANGED ({pin.changed}): held" if pin.changed else "pinned"
        print(f"  {pin.name:<48} {pin.upstream:<14} {state}  (since {seen})")
    return 0


def _pins_accept(args: argparse.Namespace, config: GatewayConfig) -> int:
    if not args.all and not args.names:
        print("error: name the tools to accept, or --all")
        return 2
    accepted = _accepted(config, None if args.all else list(args.names))
    missing = sorted(set(args.names) - set(accepted))
    for name in accepted:
        print(f"accepted {name}")
    for name in missing:
        print(f"{name}: no pending change")
    if accepted:
        print("a running gateway serves them after a reload (kill -HUP) or the upstream's next change")
    return 1 if missing else 0
