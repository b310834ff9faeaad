"""jsonschema's regular expressions, bounded in time: the one place its ``re`` is replaced.

jsonschema matches a value against ``pattern``, and property names against
``patternProperties`` (and so for ``additionalProperties`` and ``unevaluatedProperties``),
with ``re.search`` through the ``re`` attribute of three private modules, for every draft
and every subschema. The patterns are an upstream's and the strings a client's, and ``re``
backtracks without bound while holding the GIL: ``^(\\w+\\s?)*$`` against 40 characters ran
for hours, stalling every client. A validator class of our own would not cover it: a
subschema that names its own ``$schema`` (or a ``"$ref": "#"`` back to a root that does) is
checked by jsonschema's stock class again.

So those three modules search through ``bounded`` instead: the ``regex`` package, which
reads Python's dialect as ``re`` does (so a value passes or fails as it always has: JSON
Schema's ECMA-262 dialect would refuse ``José`` for ``^[\\w ]+$``, which the upstream's own
check accepts), with a time limit. Within ``budget()`` (a check of one call's arguments)
the searches share one budget, so that many strings cannot multiply it, and spending it
raises ``PatternBudgetSpent``: the check is given up and the upstream judges the value.
Elsewhere (the SDK's check of a result's structured content) each search has the budget to
itself, and one that runs out counts as a match: that value is not refused for a pattern
the gateway could not decide.

Process-wide, on purpose: every jsonschema check in the gateway's process is bounded.
``tests/test_compat.py`` checks that each module still searches through its ``re``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import ModuleType
from typing import Any

import regex
from jsonschema import _keywords, _legacy_keywords, _utils

SEARCH_BUDGET = 0.1
"""Seconds of pattern matching one check may spend (one search, outside a check)."""

SEARCHING_MODULES: tuple[ModuleType, ...] = (_keywords, _utils, _legacy_keywords)
"""jsonschema's modules whose ``re.search`` matches schemas' patterns against values."""

_DEADLINE: ContextVar[float | None] = ContextVar("agent_gateway_pattern_deadline", default=None)


class PatternBudgetSpent(Exception):
    """A check's patterns took more than its budget: the value is left to the upstream."""


@contextmanager
def budget(seconds: float = SEARCH_BUDGET) -> Iterator[None]:
    """Around one check: its searches share ``seconds``."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


class _BoundedRe:
    """``re`` as jsonschema's modules use it, with ``search`` bounded in time."""

    def search(self, pattern: str, string: str, flags: int = 0) -> Any:
        deadline = _DEADLINE.get()
        limit = SEARCH_BUDGET if deadline is None else deadline - time.monotonic()
        if limit <= 0:
            raise PatternBudgetSpent(pattern)
        try:
            # concurrent: the GIL is let go while it matches, so the event loop runs meanwhile
            # (schema_check judges refused arguments in a worker thread).
            return regex.search(pattern, string, flags, timeout=limit, concurrent=True)
        except TimeoutError:
            if deadline is not None:
                raise PatternBudgetSpent(pattern) from None
            return True  # undecided: not a reason to refuse

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


bounded = _BoundedRe()


def install() -> None:
    """Make jsonschema's pattern matching bounded (idempotent)."""
    for module in SEARCHING_MODULES:
        module.re = bounded  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]
