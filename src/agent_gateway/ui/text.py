"""Values as the status page shows them: escaped, hidden characters written out, long ones cut."""

from __future__ import annotations

import re
from html import escape as html_escape

_HIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Characters a value may hold that the page would not show as they are: controls, and the
bidirectional overrides and isolates, which make what a cell shows differ from what it holds
(a tool description's U+202E showed the rest of its cell reversed, a client's name the rest
of its row's cell): shown as their escapes (``\u202e``), as the log and the trail write them."""


def escape(text: str) -> str:
    """``text`` as the page shows it: HTML-escaped, its hidden characters shown as escapes."""
    return _HIDDEN.sub(_shown, html_escape(text))


def _shown(character: re.Match[str]) -> str:
    return f"\\u{ord(character.group()):04x}"


def cut(text: str, limit: int) -> str:
    """``text``, its first ``limit`` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}\n… ({len(text) - limit:,} more characters)"


def first_line(text: str, limit: int = 200) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else f"{line[: limit - 1]}…"
