"""``agent-gateway serve | check | tools | ask | pins``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from agent_gateway import __version__, access, runtime
from agent_gateway.agent.reporting import TerminalObserver
from agent_gateway.agent.request import AgentRequest
from agent_gateway.cli_records import add_commands
from agent_gateway.compat.stdlib import lean_log_records
from agent_gateway.config import GatewayConfig
from agent_gateway.config_files import load_config, with_server
from agent_gateway.errors import CannotServe, ConfigError
from agent_gateway.exporters import install
from agent_gateway.logs import (
    Clipped,
    JsonFormatter,
    LineFormatter,
    PeerRepeats,
    TraceIds,
    shown_command,
)
from agent_gateway.reload import Reloader, stamp
from agent_gateway.server import Gateway
from agent_gateway.serving import Reloading, serve
from agent_gateway.shown_urls import redacted_url
from agent_gateway.upstreams.environment import command_problem

logger = logging.getLogger("agent_gateway")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    handler = _log_handler("text")
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    runtime.quiet_libraries(logging.getLevelNamesMapping()[args.log_level.upper()])
    try:
        if not getattr(args, "needs_config", True):
            return int(args.run(args, None))
        config = load_config(args.config, os.environ)
        handler.setFormatter(_log_handler(config.telemetry.log_format).formatter)
        return int(args.run(args, config))
    except (ConfigError, CannotServe) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # one raised at start-up inside a task group
        refused, rest = group.split((ConfigError, CannotServe))
        if refused is None or rest is not None:
            raise
        print(f"error: {_leaves(refused)[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


def _log_handler(log_format: str) -> logging.Handler:
    """Log lines on stderr, each with the current trace and span ids (text or JSON)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(PeerRepeats())
    handler.addFilter(TraceIds())
    handler.addFilter(Clipped())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(LineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


@contextmanager
def _telemetry(config: GatewayConfig, *, scraped: bool) -> Generator[None, None, None]:
    """The process's telemetry for a command that serves or runs the agent, flushed at exit;
    ``scraped`` when it serves ``/metrics``."""
    installed = install(config.telemetry, os.environ, scraped=scraped)
    try:
        yield
    finally:
        installed.shutdown()


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line as ``main`` reads it (argparse exits on a bad one)."""
    return _parser().parse_args(argv)


LOG_LEVELS = ["debug", "info", "warning", "error"]


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: ``--log-level`` is taken after the command too (``serve … --log-level
    debug``, as ``scripts/serve`` passes its arguments on), not only before it. Its commands'
    parsers are of this class as well (argparse makes them of their parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # SUPPRESS: unset unless given here, so one given before the command stands.
        self.add_argument(
            "--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS, help="info by default"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-gateway", description="One MCP endpoint in front of many.")
    parser.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="info by default; also taken after COMMAND"
    )
    parser.add_argument("--version", action="version", version=f"agent-gateway {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=_CommandParser)

    serve = commands.add_parser("serve", help="serve the federated catalog over stdio or HTTP")
    _config_arg(serve)
    serve.add_argument("--transport", choices=["stdio", "http"], help="overrides server.transport")
    serve.add_argument("--host", help="overrides server.host")
    serve.add_argument("--port", type=int, help="overrides server.port")
    serve.add_argument(
        "--watch",
        action="store_true",
        help="reload the configuration when the file changes (SIGHUP always does)",
    )
    serve.set_defaults(run=_serve)

    check = commands.add_parser(
        "check", help="validate a configuration file, start its upstreams and report what serve would refuse"
    )
    _config_arg(check)
    check.add_argument(
        "--offline", action="store_true", help="only validate the file (and look for stdio commands)"
    )
    check.set_defaults(run=_check)

    tools = commands.add_parser("tools", help="connect to every upstream, print the catalog, exit")
    _config_arg(tools)
    tools.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tools.set_defaults(run=_tools)

    ask = commands.add_parser(
        "ask", help="run the agent in-process on one question; print its steps and answer"
    )
    _config_arg(ask)
    ask.add_argument("query", help="the request, in plain words")
    ask.add_argument("--conversation", help="continue this conversation id (thread_id)")
    ask.add_argument("--json", action="store_true", help="print the structured result (steps go to stderr)")
    ask.set_defaults(run=_ask)
    add_commands(commands, _config_arg)
    return parser


def _config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", default="gateway.yaml", help="gateway.yaml or an mcpServers JSON file"
    )


def _check(args: argparse.Namespace, config: GatewayConfig) -> int:
    print(f"{args.config}: valid")
    server = config.server
    where = "stdio" if server.transport == "stdio" else f"http://{server.host}:{server.port}{server.path}"
    print(f"  serves: {where}")
    for name, upstream in config.upstreams.items():
        target = (
            redacted_url(upstream.url)
            if upstream.url
            else shown_command(upstream.command or "", upstream.args)
        )
        state = "" if upstream.enabled else " (disabled)"
        print(f"  upstream {name}: {upstream.kind} {target}{state}")
    if args.offline:
        found = ((n, command_problem(u)) for n, u in config.active_upstreams.items())
        return _problems([f"upstream {name}: {problem}" for name, problem in found if problem])
    return anyio.run(_check_connected, Gateway(config))


async def _check_connected(gateway: Gateway) -> int:
    """Start every upstream as serve would: collisions raise ConfigError; the rest is reported.
    A one-shot command waits for every upstream, whatever ``server.startup_wait`` lets serve do."""
    async with gateway.running(settle_timeout=gateway.pool.every_upstream()):
        statuses = gateway.pool.statuses()
        tools = Counter(origin.upstream for origin in gateway.catalog.snapshot.tools.values())
    for status in statuses:
        if status.serving:
            print(f"  upstream {status.name}: up, {tools[status.name]} tools")
    down = [f"upstream {s.name}: {s.last_error or s.state}" for s in statuses if not s.serving]
    return _problems(down + [f"upstream {name}: {text}" for name, text in gateway.catalog.problems.items()])


def _problems(problems: list[str]) -> int:
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def serve_config(args: argparse.Namespace, config: GatewayConfig) -> GatewayConfig:
    """What ``serve`` runs: the file's configuration with the command line's options, checked
    as the file is (so ``--host 0.0.0.0`` meets the auth check too).

    Raises:
        ConfigError: the result is refused.
    """
    overrides = {k: v for k in ("transport", "host", "port") if (v := getattr(args, k)) is not None}
    return with_server(config, f"{args.config} (with the command line's options)", **overrides)


def _serve(args: argparse.Namespace, config: GatewayConfig) -> int:
    config = serve_config(args, config)
    lean_log_records()
    with _telemetry(config, scraped=config.server.transport == "http"):
        gateway = Gateway(config)
        reloader = Reloader(
            gateway, lambda: serve_config(args, load_config(args.config, os.environ)), args.config
        )
        watched = Path(args.config) if args.watch else None
        serve(gateway, Reloading(reloader, watched, stamp(watched) if watched is not None else None))
    return 0


def _tools(args: argparse.Namespace, config: GatewayConfig) -> int:
    return anyio.run(_print_catalog, Gateway(config), bool(args.json))


async def _print_catalog(gateway: Gateway, as_json: bool) -> int:
    async with gateway.running(settle_timeout=gateway.pool.every_upstream()):
        report = catalog_report(gateway)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0 if gateway.pool.ready else 1


def _ask(args: argparse.Namespace, config: GatewayConfig) -> int:
    if not config.agent.enabled:
        raise ConfigError(f"{args.config}: agent.enabled: the agent is switched off in this file")
    with _telemetry(config, scraped=False):
        return anyio.run(
            _run_agent, Gateway(config), AgentRequest(args.query, args.conversation), bool(args.json)
        )


async def _run_agent(gateway: Gateway, request: AgentRequest, as_json: bool) -> int:
    stream = sys.stderr if as_json else sys.stdout
    observer = TerminalObserver(lambda line: print(line, file=stream, flush=True))
    async with gateway.running(settle_timeout=gateway.pool.every_upstream()):
        assert gateway.agent is not None  # _ask checked agent.enabled
        outcome = await gateway.agent.run(request, access.OPERATOR, None, observer)
    if as_json:
        print(json.dumps(outcome.record, indent=2, ensure_ascii=False))
    else:
        print(f"\n{outcome.text}")
    return 1 if outcome.error else 0


def catalog_report(gateway: Gateway) -> dict[str, Any]:
    """The catalog and upstream states as plain data (what ``tools --json`` prints)."""
    snap = gateway.catalog.snapshot
    return {
        "tools": [
            {"name": n, "upstream": o.upstream, "original": o.name, "description": o.item.description or ""}
            for n, o in snap.tools.items()
        ],
        "prompts": [
            {"name": n, "upstream": o.upstream, "original": o.name, "description": o.item.description or ""}
            for n, o in snap.prompts.items()
        ],
        "resources": [
            {"uri": u, "upstream": o.upstream, "name": o.item.name} for u, o in snap.resources.items()
        ],
        "templates": [{"uri_template": e.public, "upstream": e.origin.upstream} for e in snap.templates],
        "upstreams": [s.as_dict() for s in gateway.pool.statuses(gateway.catalog.problems)],
    }


def _print_table(report: dict[str, Any]) -> None:
    for section in ("tools", "prompts"):
        print(f"{section.upper()} ({len(report[section])})")
        for row in report[section]:
            summary = (row["description"].strip().splitlines() or [""])[0][:70]
            print(f"  {row['name']:<48} {row['upstream']:<14} {summary}")
    print(f"RESOURCES ({len(report['resources'])}), TEMPLATES ({len(report['templates'])})")
    print("UPSTREAMS")
    for up in report["upstreams"]:
        state = up["state"] if up["circuit"] == "closed" else f"{up['state']} (circuit {up['circuit']})"
        down = f" for {up['down_for_seconds']:g}s" if up["down_for_seconds"] is not None else ""
        last_up = f", last up {up['last_up_at']}" if up["state"] != "up" and up["last_up_at"] else ""
        error = f"  last error: {up['last_error']}" if up["last_error"] else ""
        print(f"  {up['name']:<14} {up['transport']:<16} {state}{down}{last_up}{error}")


if __name__ == "__main__":
    sys.exit(main())
