"""What a client's JSON text holds, read before (or instead of) parsing it: how many values,
and whether it holds NaN or Infinity, which JSON does not have. HTTP admission (``limits``)
and a stdio client's lines (``downstream/malformed``) ask the same."""

from __future__ import annotations

import json
import re
from typing import Any

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
"""Strings, once escapes are gone. One pattern for strings with their escapes in them would be
tried again from every quote an unclosed string's escapes hold: quadratic, 10 s of the event
loop for a 148 KB body of ``\\"`` (a helper's attack). Escapes first, then plain strings: each
byte is looked at a bounded number of times."""


def json_values(body: bytes, bound: int) -> int:
    """About how many JSON values ``body`` holds (objects, arrays and the items between
    commas), at C speed: punctuation is counted first, and only when that passes ``bound``
    again without what is inside strings (text full of commas is still one value)."""
    count = body.count(b"{") + body.count(b"[") + body.count(b",")
    if count <= bound:
        return count
    bare = _STRING.sub(b"", _ESCAPE.sub(b"", body))
    return bare.count(b"{") + bare.count(b"[") + bare.count(b",")


class _Constant(ValueError):
    """NaN, Infinity or -Infinity met while parsing."""


def _constant(name: str) -> Any:
    raise _Constant(name)


def holds_constants(text: bytes | str) -> bool:
    """Whether ``text`` holds NaN or Infinity as a value. Python's parser (and the SDK's)
    takes them, and such a value reached the upstream as null: a call the client never made."""
    named = (
        "NaN" in text or "Infinity" in text
        if isinstance(text, str)
        else b"NaN" in text or b"Infinity" in text
    )
    if not named:  # nearly every message: no parse
        return False
    try:
        json.loads(text, parse_constant=_constant)
    except _Constant:
        return True
    except (ValueError, RecursionError):  # not JSON: its parser's own error says so
        return False
    return False
