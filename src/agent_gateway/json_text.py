"""What a client's JSON text holds: how many values (read before parsing it), and whether it
holds a value that cannot be passed on as written (NaN or Infinity, a number past a double's
range, a lone surrogate, bytes that are not UTF-8). HTTP admission (``limits``) and a stdio
client's lines (``downstream/malformed``) ask the same; an upstream's messages are counted
too (``compat/mcp.parse_message``)."""

from __future__ import annotations

import json
import math
import re
from array import array
from collections.abc import Iterator
from itertools import accumulate, count
from operator import sub
from typing import Any

_VALUE_MARKS = b"{[,"
"""What starts a value: an object, an array, an item after a comma."""
_BRACKETS = b"[]{}"
_DROPPED = {kept: bytes(sorted(set(range(256)) - set(kept + b'"'))) for kept in (_VALUE_MARKS, _BRACKETS)}
"""For each set of bytes looked for: every other byte but the quote (``bytes.translate``)."""


def _outside_strings(text: bytes, kept: bytes) -> bytes:
    """The bytes of ``text`` among ``kept`` that stand outside its strings, at C speed and
    without a step per string where it can: escaped backslashes and quotes out first (two
    ``replace``s: a run of backslashes pairs from its left, as a JSON reader pairs it), then
    every byte but quotes and ``kept`` ones, then quotes side by side (an empty string, or one
    string's end and the next one's start with nothing kept between them: either pair out,
    every later quote still pairs as it did), and last what lies between the quotes left.
    Patterns with a match per escape or per string cost a step each: 150-250 ms of the event
    loop for a 4 MiB body of escaped quotes, 2.8 s for a listing of a million tools."""
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    text = text.translate(None, _DROPPED[kept]).replace(b'""', b"")
    if b'"' in text:
        text = b"".join(text.split(b'"')[::2])
    return text


def json_values(body: bytes | str, bound: int) -> int:
    """About how many JSON values ``body`` holds (objects, arrays and the items between
    commas), at C speed: punctuation is counted first, and only when that passes ``bound``
    again without what is inside strings (text full of commas is still one value). A body of
    ``bound`` bytes or fewer cannot pass it and is not counted (0). The first count copies
    nothing (an upstream's answer may be 128 MiB); text is encoded only for the second."""
    if len(body) <= bound:  # each value takes a byte at least
        return 0
    count = _punctuation(body)
    if count <= bound:
        return count
    if isinstance(body, str):
        body = body.encode(errors="surrogatepass")
    return len(_outside_strings(body, _VALUE_MARKS))


def _punctuation(body: bytes | str) -> int:
    """Opening braces, brackets and commas in ``body``: three ``count``s, as fast as one
    ``translate`` (40 MB: 40 ms either way), which would copy the body."""
    if isinstance(body, str):
        return body.count("{") + body.count("[") + body.count(",")
    return body.count(b"{") + body.count(b"[") + body.count(b",")


MAX_DEPTH = 128
"""How deep a client's JSON text may nest. Python's parser stops near 1,000 levels; past 255
the SDK's models fail to serialise it (an error answered with code 0 and a traceback logged
for each), and a FastMCP upstream sent arguments 200 deep never answered."""
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")
"""Brackets as signed bytes: +1 opens a level, -1 closes one."""
_OPENINGS = bytes.maketrans(b"{}", b"[]")
"""Both kinds of bracket as one: only the levels count."""


class TooDeep(RecursionError):
    """JSON text nested deeper than ``MAX_DEPTH`` (a ``RecursionError``, as Python's parser
    raises for deeper still): read as nested too deeply wherever that is caught."""


def nests_deeper(text: bytes | str, bound: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``text`` nests deeper than ``bound``, at C speed: only text with
    more opening brackets than that is looked at (text is encoded only then), and then only
    its brackets outside strings, for the deepest level they reach (``_levels``)."""
    if not opens_past(text, bound):
        return False
    if isinstance(text, str):
        text = text.encode(errors="surrogatepass")
    return max(_levels(_outside_strings(text, _BRACKETS)), default=0) > bound


def opens_past(text: bytes | str, bound: int) -> bool:
    """Whether ``text`` holds more than ``bound`` opening brackets, strings included (two
    ``count``s): text with no more cannot nest deeper than ``bound``."""
    if isinstance(text, str):
        return text.count("{") + text.count("[") > bound
    return text.count(b"{") + text.count(b"[") > bound


def value_nests_deeper(value: Any, bound: int, values: int) -> bool | None:
    """Whether the parsed JSON ``value`` nests deeper than ``bound`` (its top container is
    level 1, as for ``nests_deeper``), walked depth first; None once its containers held more
    than ``values`` values without an answer. A step per value: next to nothing for text (an
    answer of JSON written in strings has brackets a byte scan must step over: 23 ms of a
    9 MB one), where text of many small containers is the scan's to read."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, level = stack.pop()
        if level > bound:
            return True
        items = item.values() if isinstance(item, dict) else item
        if (values := values - len(items)) < 0:  # pyright: ignore[reportUnknownArgumentType]
            return None
        stack.extend((child, level + 1) for child in items if isinstance(child, dict | list))  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return False


def fits(value: Any, chars: int) -> bool:
    """Whether the parsed JSON ``value`` is written in about ``chars`` characters or fewer,
    read a value at a time and only until it is past them: judging 50 MB costs what judging
    ``chars`` does (its ``json.dumps`` took 200 ms of the event loop)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            chars -= 2 + 2 * len(item)  # pyright: ignore[reportUnknownArgumentType]
            if chars >= 0:  # before the items are taken: a container of millions is past at once
                stack.extend(item.items() if isinstance(item, dict) else item)  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
        elif isinstance(item, tuple):  # a key and its value
            stack.extend(item)  # pyright: ignore[reportUnknownArgumentType]
        else:
            chars -= len(item) + 2 if isinstance(item, str) else len(str(item))
        if chars < 0:
            return False
    return True


def _levels(brackets: bytes) -> Iterator[int]:
    """The level after each bracket of ``brackets``, or after each opening one (the deepest is
    the same): with most of them closing, split at each opening bracket (the level after the
    k-th is k less the closing ones before it), else walked one by one, which costs a Python
    int a bracket but half a split's step. Walked, 129 opening brackets and 4 MiB of closing
    ones took 90 ms of the event loop; split, a body's 100,000 pairs took twice a walk's."""
    opening = brackets.count(b"[") + brackets.count(b"{")
    if len(brackets) <= 4 * opening:
        return accumulate(array("b", brackets.translate(_STEPS)))
    between = brackets.translate(_OPENINGS).split(b"[")[:-1]
    return map(sub, count(1), accumulate(map(len, between)))


class Unrepresentable(ValueError):
    """A value a client's JSON text holds that cannot be passed on as written (the reason)."""


def _constant(name: str) -> Any:
    raise Unrepresentable("NaN or Infinity, which JSON does not have")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Unrepresentable("a number past a double's range")
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD]")
"""Looked for only in text with a backslash (``in`` a single character is a vectorised scan;
each pattern's own scan cost 2 ms of a 3.5 MB body)."""

_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float)


def parsed(text: bytes | str) -> Any:
    """``text`` parsed as a client's JSON, by Python's parser (at C speed: the hooks run for
    floats and constants only).

    Raises:
        Unrepresentable: it holds NaN or Infinity, a number past a double's range (read as
            infinity), a surrogate escape without its pair (no UTF-8 text holds one) or, in
            bytes, what is not UTF-8 (a surrogate's own bytes among them).
            Python's parser (and the SDK's) takes each: such numbers reached the upstream
            as null, a call the client never made; a lone surrogate raised wherever the
            gateway wrote it as UTF-8 (the call's record; the audit writer, and the process).
        ValueError, RecursionError: it is not JSON, or nests too deeply to read (``TooDeep``:
            deeper than ``MAX_DEPTH``).
    """
    if nests_deeper(text):
        raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")
    if isinstance(text, bytes):  # strictly: json.loads (the SDK's too) takes a byte-order mark,
        # UTF-16 and UTF-32 (whose ASCII is valid UTF-8, NULs), and a surrogate's own bytes
        try:
            if json.detect_encoding(text) != "utf-8":
                raise UnicodeError
            text = text.decode()
        except UnicodeError:
            raise Unrepresentable("bytes that are not UTF-8 text without a byte-order mark") from None
    value = _DECODER.decode(text)
    if "\\" in text and _SURROGATE_ESCAPE.search(text) and not _utf8(value):
        raise Unrepresentable("a surrogate escape without its pair, which no UTF-8 text holds")
    return value


def unrepresentable(text: bytes | str) -> str | None:
    """Why ``text`` holds a value that cannot be passed on as written (``parsed``); None when
    it holds none, or is not JSON (its parser's own error says so)."""
    try:
        parsed(text)
    except Unrepresentable as exc:
        return str(exc)
    except (ValueError, RecursionError):
        return None
    return None


def _utf8(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def answers(message: object) -> bool:
    """Whether a parsed JSON-RPC ``message`` answers a request: an object with an id the
    request could have had (a string or an integer) and a ``result`` or an ``error``, and no
    ``method``. Asked of one that is not a valid message, to fail the request it answers."""
    if not isinstance(message, dict) or "method" in message:
        return False
    known = message.get("id")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    named = isinstance(known, str | int) and not isinstance(known, bool)
    return named and ("result" in message or "error" in message)
