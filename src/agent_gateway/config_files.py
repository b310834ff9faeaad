"""Reading a configuration: a ``gateway.yaml`` or ``mcpServers`` JSON file, ``${VAR}``
interpolation from the environment, and the one ``ConfigError`` per problem that names the
file, the field path and the reason. The models themselves are in ``config``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from agent_gateway.config import FieldProblem, GatewayConfig
from agent_gateway.config_paths import resolved
from agent_gateway.config_syntax import parse_text
from agent_gateway.errors import ConfigError

_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_config(path: str | Path, environ: Mapping[str, str]) -> GatewayConfig:
    """Read, interpolate and validate the file at ``path``.

    Raises:
        ConfigError: the file is missing, unparsable or invalid; the message names the
            file, the field path and the reason.
    """
    path = Path(path)
    raw = _read(path)
    base = path.resolve().parent
    # ${CONFIG_DIR} is always this file's directory, whatever the environment says.
    environ = {**environ, "CONFIG_DIR": str(base)}
    return parse_config(raw, environ, source=str(path), base=base)


def with_server(config: GatewayConfig, source: str, **overrides: Any) -> GatewayConfig:
    """``config`` with ``server`` fields replaced, validated again as a whole (so that, e.g.,
    ``--host 0.0.0.0`` meets the same auth check as ``server.host`` in the file).

    Raises:
        ConfigError: the result is invalid.
    """
    data = config.model_dump()
    data["server"] = {**data["server"], **overrides}
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(source, exc)) from None


def parse_config(
    raw: object, environ: Mapping[str, str], *, source: str, base: Path | None = None
) -> GatewayConfig:
    """Validate already-parsed data (``source`` names it in errors); relative paths resolve
    against ``base``, the config file's directory (``config_paths``).

    Raises:
        ConfigError: the data is invalid.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    data = _from_mcp_servers(raw)
    data = _interpolate(data, environ, source, ())
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(source, exc)) from None
    return resolved(config, base)


MAX_BYTES = 16 * 2**20
"""The largest configuration file read: a large one is tens of KiB, but a server's
``instructions`` may be long. Its values are bounded while it is parsed (PyYAML reads about
30,000 a second, off the event loop), so this only keeps a wrong file (``/dev/zero``, a log)
from being read whole."""


def _read(path: Path) -> object:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)  # bounded: /dev/zero or a log written over it
        if len(data) > MAX_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_BYTES // 2**20} MiB; is it the configuration?")
        text = data.decode("utf-8")
    except OSError as exc:
        # The whole path: run from another directory, a relative one names the wrong file.
        tried = "" if path.is_absolute() else f" {path.absolute()}"
        raise ConfigError(f"{path}: cannot read the file{tried}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8"
        ) from None
    return parse_text(path, text)


def _from_mcp_servers(raw: dict[str, Any]) -> dict[str, Any]:
    """Accept the Claude Desktop / Cursor (``mcpServers``) and VS Code (``servers``) layouts."""
    key = next((k for k in ("mcpServers", "servers") if k in raw and "upstreams" not in raw), None)
    if key is None:
        return raw
    servers = raw[key]
    upstreams = (
        {name: _from_client_entry(entry) for name, entry in servers.items()}
        if isinstance(servers, dict)
        else servers
    )
    rest = {k: v for k, v in raw.items() if k not in (key, "inputs")}
    return {**rest, "upstreams": upstreams}


def _from_client_entry(entry: object) -> object:
    if not isinstance(entry, dict):
        return entry
    converted: dict[str, Any] = dict(entry)  # pyright: ignore[reportUnknownArgumentType]
    kind = converted.pop("type", None)
    if "disabled" in converted:
        converted["enabled"] = not converted.pop("disabled")
    if kind is not None and "transport" not in converted:
        converted["transport"] = {"http": "streamable-http", "ws": "websocket"}.get(kind, kind)
    return converted


def _interpolate(value: object, environ: Mapping[str, str], source: str, at: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return _substitute(value, environ, source, at)
    if isinstance(value, dict):
        return {k: _interpolate(v, environ, source, (*at, str(k))) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return [_interpolate(v, environ, source, (*at, str(i))) for i, v in enumerate(value)]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return value


def _substitute(text: str, environ: Mapping[str, str], source: str, at: tuple[str, ...]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in environ and (environ[name] or default is None):
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{source}: {_dotted(at)}: environment variable {name} is not set "
            f"(set it, or write ${{{name}:-default}})"
        )

    return _VARIABLE.sub(replace, text)


def _describe(source: str, exc: ValidationError) -> str:
    lines = [_describe_one(error) for error in exc.errors(include_url=False)]
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return f"{source}: {len(lines)} problems:\n" + "\n".join(f"  {line}" for line in lines)


def _describe_one(error: Any) -> str:
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, FieldProblem):
        return f"{_dotted(cause.path)}: {cause.reason}"
    loc = tuple(str(part) for part in error["loc"])
    reason = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        reason = f"unknown key {loc[-1]!r}"
    elif error["type"] == "missing":
        reason = f"required key {loc[-1]!r} is missing"
    elif (shape := _SHAPES.get(error["type"])) is not None:
        reason = _wrong_shape(shape, loc, error["input"])
    return f"{_dotted(loc) or '(top level)'}: {reason}"


_SHAPES = {
    "tuple_type": "a list",
    "list_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
}
"""Pydantic's words for a value of the wrong shape (``Input should be a valid tuple``, for a
YAML string written where a list goes), in the file's own: a list, a mapping."""


def _wrong_shape(shape: str, loc: tuple[str, ...], given: object) -> str:
    # Never the value itself: it may be a secret (server.state_keys, a token).
    items = " (of strings)" if shape == "a list" and _holds_strings(loc) else ""
    return f"should be {shape}{items}, not {_kind_of(given)}"


_KINDS: tuple[tuple[type | UnionType, str], ...] = (
    (bool, "true or false"),  # before int: a bool is one
    (str, "a string"),
    (int | float, "a number"),
    (list, "a list"),
    (dict, "a mapping"),
    (type(None), "empty"),
)


def _kind_of(value: object) -> str:
    return next((kind for cls, kind in _KINDS if isinstance(value, cls)), type(value).__name__)


def _holds_strings(loc: tuple[str, ...]) -> bool:
    """Whether the list at ``loc`` in a ``GatewayConfig`` is one of strings."""
    kind: object = GatewayConfig
    for key in loc:
        kind = _unwrapped(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(key)
            kind = field.annotation if field is not None else None
        elif get_origin(kind) is dict:
            kind = get_args(kind)[1]
        elif get_origin(kind) is tuple:
            kind = get_args(kind)[0]
        else:
            return False
    items = get_args(_unwrapped(kind))
    return bool(items) and _unwrapped(items[0]) is str


def _unwrapped(kind: object) -> object:
    """``X`` of ``Annotated[X, …]`` and of ``X | None``."""
    if get_origin(kind) is Annotated:
        return _unwrapped(get_args(kind)[0])
    if get_origin(kind) in (Union, UnionType):
        rest = [arg for arg in get_args(kind) if arg is not type(None)]
        return _unwrapped(rest[0]) if len(rest) == 1 else kind
    return kind


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)
