"""A configuration file's text to data: YAML or JSON, strictly, with problems located by line.

YAML is read with YAML 1.2's booleans (``true``/``false`` only): PyYAML follows YAML 1.1, where
a bare ``on``, ``off``, ``yes`` or ``no`` is a boolean, so ``search: {mode: off}`` as the README
writes it would arrive as ``False`` and be refused as not one of its words (a boolean setting
still takes ``yes``/``on``: pydantic reads those words as true).

PyYAML and ``json`` both let a repeated key silently replace the first; in a gateway config
that hides an upstream or a setting, so a repeated key is an error naming both lines. An empty
file and a syntax error name the file and the line too, on one line.

What is read is bounded, since a reload reads it on the event loop every client is served
from: at most ``MAX_VALUES`` values once YAML's aliases are expanded (a 364-byte file of
nested aliases expands to millions, and interpolating them held the loop for seconds), at
most ``MAX_DEPTH`` levels (an alias that holds itself nests without end). Text nested too
deeply to parse, or an integer of thousands of digits, is a ``ConfigError`` as any other
problem: each ended the gateway at a reload.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

from agent_gateway.errors import ConfigError
from agent_gateway.logs import clipped

MAX_VALUES = 100_000
"""Values one configuration may hold, its aliases expanded (a large one holds a few thousand)."""
MAX_DEPTH = 64
"""Levels one configuration may nest (a large one nests under ten)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL_TAG = "tag:yaml.org,2002:bool"


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, first: int, second: int) -> None:
        super().__init__(f"line {second}: duplicate key {key!r} (first at line {first})")


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key repeated in one mapping, and text of more than
    ``MAX_VALUES`` values as soon as it is read that far (PyYAML reads about 30,000 a
    second: text far past the bound was read whole before ``_check_size`` refused it)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._composed = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._composed += 1
        if self._composed > MAX_VALUES:
            raise ConfigError(f"holds more than {MAX_VALUES:,} values")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<: *defaults` merges; its keys may be overridden on purpose
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(key, seen[key], line)
            if isinstance(key, Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep)


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_text(path: Path, text: str) -> object:
    """The data in ``text``, read from ``path`` (JSON for ``.json``, YAML otherwise).

    Raises:
        ConfigError: the text is empty, not valid, or repeats a key; the message names
            ``path`` and the line.
    """
    try:
        data = _json(path, text) if path.suffix == ".json" else _yaml(path, text)
    except RecursionError:
        raise ConfigError(f"{path}: nests too deeply to read (hundreds of levels)") from None
    except ValueError as exc:  # an integer of thousands of digits, say
        raise ConfigError(f"{path}: holds a value that cannot be read: {clipped(str(exc))}") from None
    _check_size(path, data)
    return data


def _yaml(path: Path, text: str) -> object:
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None
    if data is None:
        raise ConfigError(f"{path}: line 1: the file is empty (expected a mapping: server:, upstreams:, …)")
    return data


def _check_size(path: Path, data: object) -> None:
    """Raises ``ConfigError`` when ``data`` holds more than ``MAX_VALUES`` values (aliases
    expanded) or nests deeper than ``MAX_DEPTH`` levels; walked without recursion, and
    never past either bound."""
    pending: list[tuple[object, int]] = [(data, 1)]
    values = 0
    while pending:
        value, depth = pending.pop()
        values += 1
        if values > MAX_VALUES:
            raise ConfigError(
                f"{path}: holds more than {MAX_VALUES:,} values once its YAML aliases are expanded"
            )
        if depth > MAX_DEPTH:
            raise ConfigError(f"{path}: nests deeper than {MAX_DEPTH} levels (an alias that holds itself?)")
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value.values())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or exc.context or "invalid"
        return f"line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    return f"not valid YAML: {' '.join(str(exc).split())}"


def _json(path: Path, text: str) -> object:
    if not text.strip():
        raise ConfigError(f"{path}: line 1: the file is empty (expected a JSON object)")
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}"
        ) from None
    except _DuplicateJsonKey as exc:
        raise ConfigError(f"{path}: duplicate key {exc.key!r} in one object") from None


class _DuplicateJsonKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateJsonKey(key)
        data[key] = value
    return data
