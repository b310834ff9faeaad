"""A value checked against a tool's JSON Schema: quickly when it holds, in jsonschema's words when not.

Every ``tools/call`` checks its arguments before they leave the gateway. ``jsonschema``
(pure Python) took ~7 µs to pass a one-field object, a visible share of a call's CPU;
``jsonschema-rs`` (compiled) ~0.1 µs. The compiled validator only says that a value holds.
A value it rejects is judged again by ``jsonschema``, which words the error clients have
always been given and has the last word: where the two read a schema differently (which
formats each checks), a value either accepts passes.

A client's value never meets an upstream's ``pattern`` in Python's ``re``, a backtracking
engine: ``^(a+)+$`` took 0.5 s to reject 25 characters, doubling with each one more, and
``re`` holds the GIL, so one client's string froze every client. ``pattern`` is checked by
jsonschema-rs's engine in both validators (linear time, or a bounded number of steps for
look-around; ECMA-262's dialect, as JSON Schema specifies); ``re`` is left only a pattern
that engine cannot compile (``a{,3}``, ``(?P=name)``).

An upstream's schema must not make the gateway fetch anything. Both libraries fetch a
remote ``$ref`` over HTTP unless told not to (``jsonschema`` with a deprecation warning):
here neither is given a way to, as the SDK's client checks output schemas. A ``$ref`` that
does not resolve within the schema leaves the value to the upstream to judge, as a broken
schema does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import cache, lru_cache
from typing import Any, NoReturn

import jsonschema_rs
from jsonschema import validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

logger = logging.getLogger(__name__)


class SchemaCheck:
    """One schema, compiled for both validators."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._full = _full(schema)
        self._quick = _quick(schema) if self._full.schema is schema else None

    def first_error(self, value: Any) -> ValidationError | None:
        """The first way ``value`` fails the schema, or None when it holds."""
        if self._quick is not None:
            try:
                if self._quick.is_valid(value):
                    return None
            except (ValueError, TypeError, OverflowError):  # not JSON it can read: the full check decides
                pass
        try:
            return next(iter(self._full.iter_errors(value)), None)
        except Unresolvable as exc:
            logger.debug("schema not checked: %s", exc)
            return None


def _full(schema: dict[str, Any]) -> Validator:
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError:
        # The upstream's own schema is broken: let the upstream judge its arguments.
        return validators.Draft202012Validator({})
    return _linear(cls)(schema, format_checker=cls.FORMAT_CHECKER, registry=Registry())


@cache  # one per draft
def _linear(cls: type[Validator]) -> type[Validator]:
    """``cls`` with its ``pattern`` keyword on jsonschema-rs's regular expressions."""
    backtracking = cls.VALIDATORS["pattern"]

    def pattern(
        validator: Validator, patrn: str, instance: Any, schema: dict[str, Any]
    ) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "string"):
            return
        compiled = _pattern(patrn)
        if compiled is None:
            yield from backtracking(validator, patrn, instance, schema)
        elif not compiled.is_valid(instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")  # jsonschema's words

    return validators.extend(cls, {"pattern": pattern})


@lru_cache(maxsize=1024)
def _pattern(patrn: str) -> jsonschema_rs.Validator | None:
    try:
        return jsonschema_rs.validator_for({"type": "string", "pattern": patrn})
    except (jsonschema_rs.ValidationError, ValueError):
        return None


def _quick(schema: dict[str, Any]) -> jsonschema_rs.Validator | None:
    try:
        return jsonschema_rs.validator_for(schema, validate_formats=True, retriever=_refuse)
    except (
        jsonschema_rs.ValidationError,
        ValueError,
    ) as exc:  # e.g. a remote $ref, a regex it cannot compile
        logger.debug("schema checked by jsonschema alone: %s", exc)
        return None


def _refuse(uri: str) -> NoReturn:
    raise ValueError(f"remote schema {uri!r} is not fetched")
