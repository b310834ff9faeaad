"""A value checked against a tool's JSON Schema: quickly when it holds, in jsonschema's words when not.

Every ``tools/call`` checks its arguments before they leave the gateway. ``jsonschema``
(pure Python) took ~7 µs to pass a one-field object, a visible share of a call's CPU;
``jsonschema-rs`` (compiled) ~0.1 µs. The compiled validator only says that a value holds.
A value it rejects is judged again by ``jsonschema``, which words the error clients have
always been given and has the last word: where the two read a schema differently (which
formats each checks), a value either accepts passes.

A client's value never meets an upstream's ``pattern`` in Python's ``re``, a backtracking
engine: ``^(a+)+$`` took 0.5 s to reject 25 characters, doubling with each one more, and
``re`` holds the GIL, so one client's string froze every client. ``pattern``, and the
property names ``patternProperties`` and ``additionalProperties`` match, are checked by
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
import re
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

Errors = Iterator[ValidationError]
"""What a keyword yields. Keywords take the validator as ``Any``: jsonschema calls them with
the class ``validators.extend`` built, whose ``descend`` its ``Validator`` protocol lacks."""


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
    """``cls`` with the keywords that match a client's strings against an upstream's regular
    expressions (``pattern``; ``patternProperties`` and ``additionalProperties`` on property
    names) on jsonschema-rs's engine, each as jsonschema words its errors."""
    return validators.extend(
        cls,
        {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional},
    )


def _pattern(validator: Any, patrn: str, instance: Any, schema: dict[str, Any]) -> Errors:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for name, value in instance.items():
            if _search(patrn, name):
                yield from validator.descend(value, subschema, path=name, schema_path=patrn)


def _additional(validator: Any, allowed: Any, instance: Any, schema: dict[str, Any]) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = {
        name
        for name in instance
        if name not in properties and not any(_search(patrn, name) for patrn in patterns)
    }
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        names = sorted(extras, key=str)
        joined = ", ".join(repr(name) for name in names)
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(patrn) for patrn in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({joined} {verb} unexpected)")


def _search(patrn: str, text: str) -> bool:
    """``re.search``'s answer, in linear time where jsonschema-rs reads ``patrn``."""
    compiled = _compiled(patrn)
    return compiled.is_valid(text) if compiled is not None else re.search(patrn, text) is not None


@lru_cache(maxsize=1024)
def _compiled(patrn: str) -> jsonschema_rs.Validator | None:
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
