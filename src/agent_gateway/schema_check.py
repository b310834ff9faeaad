"""A value checked against a tool's JSON Schema: quickly when it holds, in jsonschema's words when not.

Every ``tools/call`` checks its arguments before they leave the gateway. ``jsonschema``
(pure Python) took ~7 µs to pass a one-field object, a visible share of a call's CPU;
``jsonschema-rs`` (compiled) ~0.1 µs. The compiled validator only says that a value holds.
A value it rejects is judged again by ``jsonschema``, which words the error clients have
always been given and decides every refusal. Where the two read a schema differently
(``multipleOf`` with fractions, which ``format``s each checks, regular-expression dialects),
a value either accepts passes, and the upstream judges it. The compiled validator reads the
schema as the draft ``jsonschema`` picked (their readings of an unusual ``$schema`` differ),
and its regular expressions are the linear-time engine's: a schema with look-around or
back-references is left to ``jsonschema`` alone.

What a schema may cost: ``jsonschema``'s patterns are matched within a time budget
(``compat.jsonschema``), in a worker thread that lets go of the GIL while it matches. A
check that spends it, a nesting too deep to walk, or a ``$ref`` that resolves nowhere leave
the value to the upstream, as a broken schema does. An upstream's
schema must not make the gateway fetch anything: both libraries fetch a remote ``$ref``
over HTTP unless told not to (``jsonschema`` with a blocking ``urlopen`` on the event loop),
and here neither is given a way to, as the SDK's client checks output schemas.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any, NoReturn

import anyio
import jsonschema_rs
from jsonschema import validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from agent_gateway.compat.jsonschema import PatternBudgetSpent, budget, install
from agent_gateway.errors import SHOWN, shown
from agent_gateway.logs import clipped

install()

logger = logging.getLogger(__name__)

CHECK_THREADS = 4
"""Worker threads judging refused arguments at once (others wait their turn)."""

_COMPILED: dict[type[Validator], Any] = {
    validators.Draft4Validator: jsonschema_rs.Draft4Validator,
    validators.Draft6Validator: jsonschema_rs.Draft6Validator,
    validators.Draft7Validator: jsonschema_rs.Draft7Validator,
    validators.Draft201909Validator: jsonschema_rs.Draft201909Validator,
    validators.Draft202012Validator: jsonschema_rs.Draft202012Validator,
}
"""jsonschema's class for a draft -> jsonschema-rs's (Draft 3: no quick check)."""


class SchemaCheck:
    """One schema, compiled for both validators."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._full = _full(schema)
        self._quick = _quick(type(self._full), schema) if self._full.schema is schema else None

    def first_error(self, value: Any) -> ValidationError | None:
        """The first way ``value`` fails the schema, or None when it holds (or cannot be
        judged here: the upstream judges it)."""
        return None if self._holds(value) else self._judged(value)

    async def refusal(self, value: Any) -> ValidationError | None:
        """``first_error``, with the full check (when the quick one does not pass ``value``)
        in a worker thread: its pattern matching lets go of the GIL, so the event loop serves
        everyone else while one client's values spend their budget (a few threads at most)."""
        if self._holds(value):
            return None
        return await anyio.to_thread.run_sync(self._judged, value, limiter=_checking())

    def holds(self, value: Any) -> bool:
        """Whether the quick check alone passes ``value`` (False: it cannot tell)."""
        return self._holds(value)

    def _holds(self, value: Any) -> bool:
        if self._quick is None:
            return False
        try:
            return bool(self._quick.is_valid(value))
        except (ValueError, TypeError, OverflowError):  # not JSON it can read: the full check decides
            return False

    def _judged(self, value: Any) -> ValidationError | None:
        try:
            with budget():
                return next(iter(self._full.iter_errors(value)), None)
        except (Unresolvable, RecursionError) as exc:
            logger.debug("arguments not checked: %s", type(exc).__name__)
        except PatternBudgetSpent as exc:
            logger.warning("arguments not checked: pattern %.80r took over its time budget", str(exc))
        return None


@cache
def _checking() -> anyio.CapacityLimiter:
    return anyio.CapacityLimiter(CHECK_THREADS)


def _full(schema: dict[str, Any]) -> Validator:
    try:
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        cls.check_schema(schema)
    except (SchemaError, AttributeError, TypeError):  # AttributeError: a $schema that is not a string
        # The upstream's own schema is broken: let the upstream judge its arguments.
        return validators.Draft202012Validator({})
    return cls(schema, format_checker=cls.FORMAT_CHECKER, registry=Registry())


def _quick(cls: type[Validator], schema: dict[str, Any]) -> Any:
    compiled = _COMPILED.get(cls)
    if compiled is None:
        return None
    try:
        return compiled(
            schema, validate_formats=True, retriever=_refuse, pattern_options=jsonschema_rs.RegexOptions()
        )
    except (jsonschema_rs.ValidationError, ValueError) as exc:  # a remote $ref, look-around, ...
        logger.debug("schema checked by jsonschema alone: %s", exc)
        return None


def _refuse(uri: str) -> NoReturn:
    raise ValueError(f"remote schema {uri!r} is not fetched")


def reason(error: ValidationError) -> str:
    """Why a value failed its schema, in jsonschema's words, prefixed by where in it, with no
    more of the client's value than ``errors.SHOWN`` characters of each part (jsonschema repeats
    the value whole: a 1 MB string where a number belongs would come back as a 1 MB error) and
    ``_MOST`` in all (it lists an object's extra keys, each whole)."""
    message = error.message
    whole = repr(error.instance)
    if len(whole) > SHOWN and whole in message:
        cut = shown(error.instance) if isinstance(error.instance, str) else str(clipped(whole, SHOWN))
        message = message.replace(whole, cut)
    where = "/".join(str(clipped(str(p), SHOWN)) for p in error.absolute_path)
    return str(clipped(f"{where}: {message}" if where else message, _MOST))


_MOST = 500
