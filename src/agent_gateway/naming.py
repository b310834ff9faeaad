"""Public names: ``{upstream}{sep}{name}`` <-> (upstream, name), charset, length cap, collisions.

Pure functions, no I/O. Real clients and model APIs accept only ``^[A-Za-z0-9_-]{1,64}$``
(the spec allows more; many clients do not), so every public name obeys that. The mapping
back is a lookup table: a public name is never parsed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Annotated, Generic, TypeVar

from pydantic import AfterValidator, Field

if TYPE_CHECKING:
    from agent_gateway.config import GatewayConfig

SEARCH_TOOLS = "search_tools"
CALL_TOOL = "call_tool"
"""The gateway's own tools in search mode (``search/tools.py``)."""
DEFAULT_SEPARATOR = "__"
MAX_NAME_LENGTH = 64
_HASH_LENGTH = 8

PUBLIC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
UPSTREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_DISALLOWED = re.compile(r"[^A-Za-z0-9_-]")

T = TypeVar("T")


def upstream_name_problem(name: str, separator: str = DEFAULT_SEPARATOR) -> str | None:
    """Why ``name`` cannot name an upstream, or None when it can."""
    if not UPSTREAM_NAME.match(name):
        return "must be 1-32 characters of A-Z a-z 0-9 _ - and start with a letter or digit"
    if separator in name:
        return f"must not contain the separator {separator!r}"
    if any(name.endswith(separator[:n]) for n in range(1, len(separator))):
        # "a_" + "__" + "x" is "a___x", which a policy's "a__*" (upstream a's tools) matches.
        return (
            f"must not end with {separator[0]!r}: its tools' names would begin with "
            f"{name[:-1]}{separator}, as another upstream's would, and its globs match them"
        )
    return None


def _not_a_search_tool(name: str) -> str:
    # With search ``auto``, any client may be in search mode once the catalog grows: an agent
    # of the same name would be listed next to it and never be reached (the name routes there).
    if name in (SEARCH_TOOLS, CALL_TOOL):
        raise ValueError(f"{name!r} is the name of one of the gateway's search tools; choose another")
    return name


AgentName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$"), AfterValidator(_not_a_search_tool)]
"""The name ``ask_agent`` is listed under: a public name, not one of the search tools'."""


def sanitize(name: str) -> str:
    """Replace every character outside the portable charset with ``_``."""
    return _DISALLOWED.sub("_", name) or "_"


def public_name(upstream: str, name: str, *, prefix: bool = True, separator: str = DEFAULT_SEPARATOR) -> str:
    """The name a client sees for ``name`` of ``upstream``."""
    joined = f"{upstream}{separator}{name}" if prefix else name
    # Hash the raw joined name so two raw names that sanitize alike still shorten apart.
    cleaned = sanitize(joined)
    if len(cleaned) <= MAX_NAME_LENGTH:
        return cleaned
    digest = hashlib.sha256(joined.encode()).hexdigest()[:_HASH_LENGTH]
    return f"{cleaned[: MAX_NAME_LENGTH - _HASH_LENGTH - 1]}-{digest}"


def matches_any(name: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """True when ``name`` matches one of the glob ``patterns`` (case-sensitive)."""
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def is_selected(
    name: str, include: list[str] | tuple[str, ...], exclude: list[str] | tuple[str, ...]
) -> bool:
    """Apply include/exclude globs: included by one pattern and excluded by none."""
    return matches_any(name, include) and not matches_any(name, exclude)


@dataclass(frozen=True, slots=True)
class Origin(Generic[T]):
    """Where a public name comes from: the upstream, its own name there, and the item."""

    upstream: str
    name: str
    item: T


class NameCollision(ValueError):
    """Two origins produce the same public name."""

    def __init__(self, kind: str, public: str, first: Origin[object], second: Origin[object]) -> None:
        super().__init__(
            f"{kind} name {public!r} is produced by both upstream {first.upstream!r} ({kind} {first.name!r}) "
            f"and upstream {second.upstream!r} ({kind} {second.name!r}); "
            f"add a 'rename' for one of them or turn 'prefix' on"
        )
        self.public = public
        self.first = first
        self.second = second


def build_table(kind: str, entries: list[tuple[str, Origin[T]]]) -> dict[str, Origin[T]]:
    """Map public names to origins.

    Raises:
        NameCollision: two entries share a public name.
    """
    table: dict[str, Origin[T]] = {}
    for public, origin in entries:
        if (existing := table.get(public)) is not None:
            raise NameCollision(kind, public, existing, origin)  # type: ignore[arg-type]
        table[public] = origin
    return table


def own_tool_names(config: GatewayConfig) -> frozenset[str]:
    """The public names of the gateway's own tools, which no upstream tool may take (the
    agent's own ``search_tools`` too, which it offers its model over a large toolbox)."""
    names = {config.agent.name, SEARCH_TOOLS} if config.agent.enabled else set[str]()
    if config.search.mode != "off":
        names |= {SEARCH_TOOLS, CALL_TOOL}
    return frozenset(names)
