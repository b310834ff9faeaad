"""What a configuration's relative paths and interpreter names mean, whoever launches the gateway.

An IDE launches ``serve --transport stdio`` from a working directory of its own, with a
minimal ``PATH``; a file that meant ``.agent-gateway/memory.jsonl`` next to itself, or the
``python`` that runs the gateway, must still mean that. So, once at load:

- relative paths resolve against the **config file's directory**: an upstream's ``cwd``
  (which also defaults to that directory, so relative ``args`` mean the same from anywhere),
  a ``command`` written as a relative path (``./bin/server``), ``env`` values written as
  relative paths (``./…`` or ``../…``; their parent directory is created when missing, since
  servers such as server-memory do not create it), ``agent.memory.path`` and ``audit.path``;
- ``command: python`` or ``python3`` is the gateway's own interpreter (``sys.executable``),
  unless a path is given.

A configuration built from data (no file) keeps its paths as they are. The top-level
``env_passthrough`` is folded into each upstream's here too, so an upstream's config says
everything about its process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent_gateway.config import GatewayConfig, UpstreamConfig

PYTHON_NAMES = frozenset({"python", "python3"})
"""Interpreter names that mean the gateway's own Python."""

_RELATIVE = ("./", "../")


def resolved(config: GatewayConfig, base: Path | None) -> GatewayConfig:
    """``config`` with its interpreter names replaced and, when it came from a file in
    ``base``, its relative paths made absolute against ``base``."""
    upstreams = {
        name: _upstream(_inheriting(upstream, config.env_passthrough), base)
        for name, upstream in config.upstreams.items()
    }
    update: dict[str, object] = {"upstreams": upstreams}
    memory = config.agent.memory
    if base is not None and not Path(memory.path).is_absolute():
        memory = memory.model_copy(update={"path": str(base / memory.path)})
        update["agent"] = config.agent.model_copy(update={"memory": memory})
    if base is not None and not Path(config.audit.path).is_absolute():
        update["audit"] = config.audit.model_copy(update={"path": str(base / config.audit.path)})
    return config.model_copy(update=update)


def _upstream(upstream: UpstreamConfig, base: Path | None) -> UpstreamConfig:
    if upstream.command is None:
        return upstream
    update: dict[str, object] = {"command": _command(upstream.command, base)}
    if base is not None:
        update["cwd"] = str(base / upstream.cwd) if upstream.cwd else str(base)
        update["env"] = {key: _env_value(value, base) for key, value in upstream.env.items()}
    return upstream.model_copy(update=update)


def _inheriting(upstream: UpstreamConfig, names: tuple[str, ...]) -> UpstreamConfig:
    if not names:
        return upstream
    merged = tuple(dict.fromkeys((*names, *upstream.env_passthrough)))
    return upstream.model_copy(update={"env_passthrough": merged})


def _command(command: str, base: Path | None) -> str:
    if command in PYTHON_NAMES:
        return sys.executable
    if base is not None and "/" in command and not Path(command).is_absolute():
        return str(base / command)
    return command


def _env_value(value: str, base: Path) -> str:
    if not value.startswith(_RELATIVE):
        return value
    path = (base / value).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)
