"""``agent-gateway pins list | accept`` and ``agent-gateway audit verify``: the operator's
commands over what the gateway records (they work on the files, with the gateway stopped or
running). ``audit verify`` reads no configuration: it checks the files it is given."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from agent_gateway.audit import verify
from agent_gateway.config import GatewayConfig
from agent_gateway.pins import Pins, pins_path


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


def _open_pins(config: GatewayConfig) -> Pins:
    return Pins(pins_path(config), config.pinning)


def _pins_list(args: argparse.Namespace, config: GatewayConfig) -> int:
    pins = _open_pins(config)
    try:
        rows = pins.pins()
    finally:
        pins.close()
    print(f"{len(rows)} pinned tools in {pins_path(config)}")
    for pin in rows:
        seen = time.strftime("%Y-%m-%d %H:%M", time.localtime(pin.first_seen))
        state = f"CHANGED ({pin.changed}): held" if pin.changed else "pinned"
        print(f"  {pin.name:<48} {pin.upstream:<14} {state}  (since {seen})")
    return 0


def _pins_accept(args: argparse.Namespace, config: GatewayConfig) -> int:
    if not args.all and not args.names:
        print("error: name the tools to accept, or --all")
        return 2
    pins = _open_pins(config)
    try:
        accepted = pins.accept(None if args.all else list(args.names))
    finally:
        pins.close()
    missing = sorted(set(args.names) - set(accepted))
    for name in accepted:
        print(f"accepted {name}")
    for name in missing:
        print(f"{name}: no pending change")
    if accepted:
        print("a running gateway serves them after a reload (kill -HUP) or the upstream's next change")
    return 1 if missing else 0
