"""The one parser for JSON that a user typed or uploaded (profile documents, host labels,
imported files read whole).

``json.loads`` alone is not enough for text from a browser:

- ``\\u0000`` is valid JSON but PostgreSQL can store it in neither ``jsonb`` nor ``text``
  (the save fails with a database error, a 500), so a NUL anywhere — key or string — is
  refused here, with the place it was found;
- nesting 100k deep makes ``json.loads`` raise ``RecursionError`` (or worse, a crash of the C
  scanner on a small stack), so the depth is measured first, by a flat scan of the brackets
  outside strings, before anything recursive runs;
- ``NaN``/``Infinity`` (and numbers like ``1e999`` that overflow to infinity) are not JSON and
  cannot be stored in ``jsonb``;
- unpaired surrogates (``"\\ud800"``) cannot be encoded as UTF-8, so they fail at save time too.

Every refusal is a ``UserJSONError`` (a ``ValueError``) whose message is meant for the person
who typed the text: what is wrong and, where it can tell, the line and column.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["DEFAULT_MAX_DEPTH", "UserJSONError", "check_value", "parse"]

DEFAULT_MAX_DEPTH = 64

# A JSON string (with its escapes) or one bracket. Strings are matched whole so brackets
# inside them do not count; the regex is iterative, so any depth is safe to scan.
_TOKENS = re.compile(r'"(?:[^"\\]+|\\.)*"|[\[\]{}]', re.DOTALL)


class UserJSONError(ValueError):
    """JSON from a user that the panel will not accept; the message says why, for them."""


def parse(text: str | bytes, *, what: str = "JSON", max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse ``text`` (str, or bytes in UTF-8 with or without a BOM) and return the value, or
    raise ``UserJSONError`` naming ``what`` ("Profile JSON", "Labels" …) and the problem."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UserJSONError(
                f"{what} is not UTF-8 text (bad byte at offset {exc.start})."
            ) from None
    elif text.startswith("\ufeff"):
        text = text[1:]
    _check_depth(text, what, max_depth)
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise UserJSONError(
            f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    except _NonFinite as exc:
        raise UserJSONError(
            f"{what} contains {exc.args[0]}: JSON numbers must be finite "
            "(NaN and Infinity are not JSON)."
        ) from None
    except RecursionError:  # belt and braces: the depth scan should have caught it
        raise UserJSONError(f"{what} is nested too deeply (at most {max_depth} levels).") from None
    except ValueError:  # an integer with more digits than Python converts (4300)
        raise UserJSONError(f"{what} contains a number with too many digits.") from None
    check_value(value, what=what)
    return value


def check_value(value: Any, *, what: str = "JSON") -> None:
    """Refuse strings (keys included) that PostgreSQL cannot store: a NUL character or an
    unpaired surrogate. For values that did not come through ``parse`` (an imported file's
    fields read by a streaming parser). The walk is iterative: depth costs no stack."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_string(item, what, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str):
                    _check_string(key, what, path, is_key=True)
                stack.append((child, where))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _check_string(text: str, what: str, path: str, *, is_key: bool = False) -> None:
    if is_key:
        place = f" (in a key under {path})" if path else " (in a top-level key)"
    else:
        place = f" (at {path})" if path else ""
    if "\x00" in text:
        raise UserJSONError(
            f"{what} contains a NUL character (\\u0000){place}, which cannot be stored."
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserJSONError(
            f"{what} contains an unpaired surrogate escape (\\ud800–\\udfff){place}, "
            "which is not valid Unicode."
        ) from None


def _check_depth(text: str, what: str, max_depth: int) -> None:
    depth = 0
    for match in _TOKENS.finditer(text):
        found = match.group()  # a whole string (skipped) or one bracket
        if found in ("[", "{"):
            depth += 1
            if depth > max_depth:
                line, column = _line_column(text, match.start())
                raise UserJSONError(
                    f"{what} is nested too deeply: more than {max_depth} levels "
                    f"(line {line}, column {column})."
                )
        elif found in ("]", "}"):
            depth -= 1


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NonFinite(name)


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise _NonFinite(f"the number {literal}, which is too large")
    return number
