"""What is pinned of a tool (``pins.py``): its public name and the fields that say what it
does, as one canonical JSON text, and that text's digest. Two listings of a tool whose digests
differ are a change to review."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types

FIELDS = ("description", "title", "inputSchema", "outputSchema", "annotations")
"""The fields of a tool that are pinned (a change of any other is not reviewed)."""


def pinned_form(name: str, tool: types.Tool) -> tuple[dict[str, Any], str]:
    """What is pinned of a tool (its public name and each of ``FIELDS`` it has, as a JSON dump
    of the tool has them), and that as the text its digest is of and as it is stored.

    Read from the fields: the schemas are parsed JSON already, and dumping the whole tool
    walked them once more. Except where a schema holds a number JSON cannot (``1e400`` parses
    as infinity): the dump writes it as null, and so did every release before this one.
    """
    definition = _definition(name, tool)
    try:
        return definition, _canonical(definition)
    except ValueError:  # a non-finite number
        dumped = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
        definition = {"name": name} | {f: dumped[f] for f in FIELDS if f in dumped}
        return definition, _canonical(definition)


def _definition(name: str, tool: types.Tool) -> dict[str, Any]:
    annotations = tool.annotations
    fields = {
        "description": tool.description,
        "title": tool.title,
        "inputSchema": tool.input_schema,
        "outputSchema": tool.output_schema,
        "annotations": (
            annotations.model_dump(by_alias=True, mode="json", exclude_none=True) if annotations else None
        ),
    }
    return {"name": name} | {f: value for f, value in fields.items() if value is not None}


def _canonical(definition: Mapping[str, Any]) -> str:
    return json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest_of(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()
