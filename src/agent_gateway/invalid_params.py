"""What a request's params failed, field by field, as the error its client receives (the SDK
answers each such request with no word of which field)."""

from __future__ import annotations

from pydantic import ValidationError

from agent_gateway.errors import SHOWN, InvalidRequest

_PROBLEMS_SHOWN = 3
"""The most of a request's invalid fields one error names (the client then fixes and retries)."""


def invalid_params(exc: ValidationError) -> InvalidRequest | None:
    """What a request's params failed, field by field, as the error its client receives; None
    when ``exc`` is not about a request's params (a model the gateway itself built).

    The SDK answers each such request ``-32602 "Invalid request parameters"`` with empty
    ``data``, and pydantic's own text would repeat the client's values: this names each field
    and what it should be (pydantic's template, without the input), so a client sending a
    ``progressToken`` that is an object learns which field to fix.
    """
    if not exc.title.endswith(("Request", "RequestParams")):
        return None
    fields: dict[tuple[int | str, ...], list[str]] = {}
    for problem in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = problem["loc"]
        if loc and loc[-1] in _MEMBERS:  # one member of a union: the union's field, each member's wish
            loc = loc[:-1]
        fields.setdefault(loc, []).append(problem["msg"].removeprefix("Input should be "))
    named = [
        f"{_field(loc)}: should be {' or '.join(wishes)}"
        for loc, wishes in list(fields.items())[:_PROBLEMS_SHOWN]
    ]
    more = len(fields) - len(named)
    return InvalidRequest(
        f"Invalid request parameters: {'; '.join(named)}" + (f" (and {more} more)" if more else "")
    )


_MEMBERS = frozenset({"str", "int", "float", "bool", "none", "list[any]", "dict[str,any]"})
"""How pydantic names a union's simple members at the end of a field's path."""


def _field(loc: tuple[int | str, ...]) -> str:
    """A field's path as written in JSON (``params._meta.progressToken``), clipped: a key in
    it may be the client's own."""
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    return path if len(path) <= SHOWN else f"{path[:SHOWN]}..."
