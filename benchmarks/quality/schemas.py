"""JSON Schema for probe items' answers, checked without reaching anywhere (pure: no Django).

jsonschema resolves a ``$ref`` it does not hold by fetching it: ``{"$ref":
"http://127.0.0.1:PORT/internal.json"}`` or ``file:///…`` in an uploaded probe set made the
panel (and the worker scoring answers) request a URL or read a local file of the attacker's
choosing, and the content came back in the validation message (issue 38). Here only
references inside the schema itself (``#``, ``#/$defs/...``) resolve: the registry retrieves
nothing, an upload naming any other reference is refused, and a schema whose references
recurse without end is refused too (it was a RecursionError, a 500)."""

from __future__ import annotations

import functools
from typing import Any

from referencing import Registry
from referencing.exceptions import NoSuchResource

from benchmarks.quality import patterns

REFERENCE_KEYS = ("$ref", "$dynamicRef")
# Values a schema is tried against at upload: a reference cycle that consumes no part of the
# instance recurses on the smallest of them.
PROBES = (None, 0, "", [], {}, [0], {"a": 0})


def _retrieve_nothing(uri: str):
    raise NoSuchResource(ref=uri)


# Immutable, so one for every thread: it only ever holds what a schema brings itself.
LOCAL_ONLY = Registry(retrieve=_retrieve_nothing)


def validator(schema: dict):
    return _validator_class()(schema, registry=LOCAL_ONLY)


@functools.cache  # made once a process (thread-safe); jsonschema imported only when needed
def _validator_class():
    """Draft 2020-12 with ``pattern`` run under the time bound of user regexes
    (benchmarks.quality.patterns): jsonschema's own uses ``re`` with none."""
    from jsonschema import Draft202012Validator, ValidationError, validators

    def pattern(validator, expression, instance, schema):
        if validator.is_type(instance, "string") and not patterns.search(expression, instance):
            yield ValidationError(f"{instance!r} does not match {expression!r}")

    return validators.extend(Draft202012Validator, {"pattern": pattern})


def unbounded_keyword(schema: Any) -> str | None:
    """A keyword whose regexes jsonschema runs with ``re``, beyond any time bound, or None."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "patternProperties" in node:
                return "patternProperties"
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def foreign_reference(schema: Any) -> str | None:
    """The first reference that points outside the schema (anything but ``#...``), or None."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in REFERENCE_KEYS and isinstance(value, str) and not value.startswith("#"):
                    return value
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be an answer key's schema, or None."""
    from jsonschema import SchemaError

    if not isinstance(schema, dict):
        return "'schema' (a JSON Schema object) is required"
    try:
        validator(schema).check_schema(schema)
    except SchemaError as exc:
        return f"bad JSON Schema: {exc.message}"
    unbounded = unbounded_keyword(schema)
    if unbounded is not None:
        return (
            f"{unbounded} is not supported in a probe's schema (its regexes would run without "
            "a time bound): name the properties instead"
        )
    foreign = foreign_reference(schema)
    if foreign is not None:
        return (
            f"the schema refers to {foreign!r}: only references within the schema itself "
            "(#/$defs/...) are allowed; nothing is fetched"
        )
    checker = validator(schema)
    for value in PROBES:
        try:
            next(iter(checker.iter_errors(value)), None)
        except RecursionError:
            return "the schema's references recurse without end"
        except Exception as exc:  # noqa: BLE001 - an unresolvable reference, said in words
            return f"the schema cannot be used: {_words(exc)}"
    return None


def first_error(schema: dict, value: Any) -> tuple[str | None, str | None]:
    """(where, message) of the first way ``value`` breaks ``schema``, (None, None) when it
    fits; (None, why) when the schema could not be applied to this value."""
    try:
        error = next(iter(validator(schema).iter_errors(value)), None)
    except RecursionError:
        return None, "the schema's references recurse too deeply for this answer"
    except Exception as exc:  # noqa: BLE001 - an unresolvable reference: never fetched
        return None, f"the schema cannot be used: {_words(exc)}"
    if error is None:
        return None, None
    return "/".join(str(p) for p in error.absolute_path) or "(root)", error.message


def _words(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
