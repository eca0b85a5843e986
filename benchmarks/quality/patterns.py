"""User-written regular expressions, run under a time bound (pure: no Django).

Probe items carry regexes (the ``regex`` scorer's pattern, JSON Schema ``pattern``) that run
in the web tier (the upload checks each item's reference and wrong answers) and in the worker
(scoring answers). With Python's ``re`` a pattern like ``(a+)+b`` against 25 ``a``s took 10.4
s and stalled ``/healthz`` for 8.7 s (issue 38). These run on the ``regex`` module instead
(the same syntax as ``re`` for what a probe needs, and a ``timeout`` on every match; RE2
would refuse backreferences and lookarounds that probe authors use), bounded by
``TIMEOUT_S``."""

from __future__ import annotations

import functools

import regex

TIMEOUT_S = 0.25
FLAGS = {"i": regex.IGNORECASE, "s": regex.DOTALL, "m": regex.MULTILINE}


class PatternTimeout(ValueError):
    """A pattern that took longer than TIMEOUT_S on a text."""


@functools.lru_cache(maxsize=512)  # thread-safe; patterns repeat across a probe's items
def compiled(pattern: str, flags: int = 0) -> regex.Pattern:
    """The compiled pattern (``regex.error`` on bad syntax), ``re``'s semantics (VERSION0)."""
    return regex.compile(pattern, flags | regex.VERSION0)


def fullmatch(pattern: str, text: str, flags: int = 0):
    return _run(pattern, flags, "fullmatch", text)


def search(pattern: str, text: str, flags: int = 0):
    return _run(pattern, flags, "search", text)


def _run(pattern: str, flags: int, how: str, text: str):
    try:
        return getattr(compiled(pattern, flags), how)(text, timeout=TIMEOUT_S)
    except TimeoutError:
        shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
        raise PatternTimeout(
            f"the pattern {shown!r} took over {TIMEOUT_S:g} s on a text of {len(text)} "
            "characters (nested repeats backtracking?)"
        ) from None
