"""What a stdio upstream's process is started with: its command, found as the OS would find it.

A command that is not there is named in the error (``command 'no-such-mcp-server' not found on
PATH``), not left to the OS's ``[Errno 2] No such file or directory``, which names nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from mcp.client.stdio import get_default_environment

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import CommandNotFound


def child_environment(config: UpstreamConfig) -> dict[str, str]:
    """The environment a stdio upstream's process gets: the SDK's safe variables, then its ``env``."""
    return {**get_default_environment(), **config.env}


def command_problem(config: UpstreamConfig) -> str | None:
    """Why a stdio upstream's command cannot be started, or None (also for remote upstreams)."""
    if config.command is None:
        return None
    try:
        check_command(config.command, child_environment(config), config.cwd)
    except CommandNotFound as exc:
        return str(exc)
    return None


def check_command(command: str, environment: Mapping[str, str], cwd: str | None = None) -> None:
    """Check that ``command`` names an executable for a child with ``environment`` started in
    ``cwd``: looked up on the child's own ``PATH`` (as ``subprocess`` does), or, written with
    a ``/``, taken relative to ``cwd``.

    Raises:
        CommandNotFound: there is no such executable.
    """
    if os.sep not in command:
        if shutil.which(command, path=environment.get("PATH", os.defpath)) is None:
            raise CommandNotFound(f"command {command!r} not found on PATH")
        return
    path = Path(cwd or ".") / command
    if not path.is_file():
        raise CommandNotFound(f"command {command!r} not found")
    if not os.access(path, os.X_OK):
        raise CommandNotFound(f"command {command!r} is not executable")
