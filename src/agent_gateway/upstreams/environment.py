"""What a stdio upstream's process is started with: its environment, and its command, found
as the OS would find it.

The environment is not the gateway's whole environment (which may hold any secret), but:
the SDK's safe variables (``HOME``, ``PATH``, ``USER``, …), the proxy and CA settings, without
which ``npx``'s first download fails behind a proxy (``HTTP(S)_PROXY``, ``NO_PROXY``,
``ALL_PROXY`` in either case, ``NODE_EXTRA_CA_CERTS``, ``SSL_CERT_FILE``, ``SSL_CERT_DIR``,
``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``), npm's own settings (``npm_config_*``), the
names the config's ``env_passthrough`` adds, then the upstream's ``env``.

A command that is not there is named in the error (``command 'no-such-mcp-server' not found on
PATH``), not left to the OS's ``[Errno 2] No such file or directory``, which names nothing.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from mcp.client.stdio import get_default_environment

from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import CommandNotFound

_NETWORK = frozenset(
    {
        *(f"{name}_PROXY" for name in ("HTTP", "HTTPS", "NO", "ALL")),
        *(f"{name}_proxy" for name in ("http", "https", "no", "all")),
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
_PASSED = ("npm_config_*", "NPM_CONFIG_*")


def child_environment(config: UpstreamConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a stdio upstream's process gets, from ``environ`` (the gateway's own)."""
    environ = os.environ if environ is None else environ
    patterns = (*_PASSED, *config.env_passthrough)
    inherited = {
        name: value
        for name, value in environ.items()
        if (name in _NETWORK or any(fnmatch.fnmatchcase(name, p) for p in patterns))
        and not value.startswith("()")  # a shell function, as the SDK skips them
    }
    return {**get_default_environment(), **inherited, **config.env}


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
        searched = environment.get("PATH", os.defpath)
        if shutil.which(command, path=searched) is None:
            raise CommandNotFound(f"command {command!r} not found on PATH {_shown_path(searched)}")
        return
    path = Path(cwd or ".") / command
    if not path.is_file():
        raise CommandNotFound(f"command {command!r} not found")
    if not os.access(path, os.X_OK):
        raise CommandNotFound(f"command {command!r} is not executable")


MAX_SHOWN_PATH = 300
"""The characters of a ``PATH`` an error shows (not a secret; a long one is cut)."""


def _shown_path(searched: str) -> str:
    shown = searched if len(searched) <= MAX_SHOWN_PATH else f"{searched[:MAX_SHOWN_PATH]}…"
    return repr(shown)
