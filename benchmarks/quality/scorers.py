"""Scorers: is a model's answer right according to the item's key?

Each scorer is forgiving about presentation (Unicode normal form, spacing, a trailing period,
"Answer: B", a ```json fence) and strict about content, so that a quantised model is not
marked down for formatting noise that a person would not count, while a changed fact still is.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from benchmarks.quality import patterns, schemas
from benchmarks.quality.item import CHOICE_LETTERS, ProbeItem


@dataclass(frozen=True)
class ItemScore:
    """``correct`` is None only when it cannot be known (an agreement item with no baseline)."""

    correct: bool | None
    json_valid: bool | None = None
    schema_ok: bool | None = None
    detail: str = ""


# Wrapping that does not change what an answer says: quotes, brackets, markdown emphasis.
_WRAP = "\"'`*_“”‘’「」『』《》〈〉"
_TRAILING = ".,;:!?。、！？…"
_SPACE = re.compile(r"\s+")


def normalize(text: str, *, case_sensitive: bool = False) -> str:
    """NFC, one space for any run of whitespace, no wrapping quotes or trailing punctuation.

    Korean has no case; ``casefold`` leaves Hangul unchanged, so one rule serves both.
    """
    text = unicodedata.normalize("NFC", text or "")
    text = _SPACE.sub(" ", text).strip()
    previous = None
    while previous != text:
        previous = text
        text = text.strip().rstrip(_TRAILING).strip()
        if len(text) >= 2 and text[0] in _WRAP and text[-1] in _WRAP:
            text = text[1:-1]
    return text if case_sensitive else text.casefold()


def _exact(item: ProbeItem, answer: str) -> ItemScore:
    key = item.answer
    accepted = key.expected if isinstance(key.expected, list) else [key.expected]
    got = normalize(answer, case_sensitive=key.case_sensitive)
    for expected in accepted:
        if got == normalize(expected, case_sensitive=key.case_sensitive):
            return ItemScore(True, detail="exact match")
    return ItemScore(False, detail=f"expected {accepted[0]!r}")


def _regex(item: ProbeItem, answer: str) -> ItemScore:
    flags = 0
    for letter in item.answer.flags:
        flags |= patterns.FLAGS[letter]
    text = unicodedata.normalize("NFC", answer or "").strip()
    if patterns.fullmatch(item.answer.pattern, text, flags):
        return ItemScore(True, detail="pattern matches")
    return ItemScore(False, detail="pattern does not match the whole answer")


# Thousands separators only in groups of three, so "1,2,3" stays three numbers.
_NUMBER = re.compile(r"[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number in the text: "1,234", "-5", "3.5", "정답은 42개입니다" -> 42."""
    text = unicodedata.normalize("NFKC", text or "")  # full-width digits become ASCII
    found = None
    for match in _NUMBER.finditer(text):
        found = match.group(0)
    if found is None:
        return None
    return float(found.replace(",", "").replace("−", "-"))


def _numeric(item: ProbeItem, answer: str) -> ItemScore:
    key = item.answer
    got = last_number(answer)
    if got is None:
        return ItemScore(False, detail="no number in the answer")
    expected = float(key.expected)
    # Without a stated tolerance only float noise is forgiven, not rounding.
    allowed = max(key.tolerance or 0.0, (key.rel_tolerance or 0.0) * abs(expected), 1e-9)
    if abs(got - expected) <= allowed:
        return ItemScore(True, detail=f"{got:g} within {allowed:g} of {expected:g}")
    return ItemScore(False, detail=f"{got:g} is not {expected:g}")


_LETTER = f"[{CHOICE_LETTERS}]"
_CHOICE_PATTERNS = (
    # The whole answer is the letter, in either case: "B", "b", "(B)", "B.".
    re.compile(rf"^\s*[(\[]?({_LETTER})[)\].:]?\s*$", re.I),
    # The answer starts with the capital letter: "B) Seoul", "B. Dolphin".
    re.compile(rf"^\s*[(\[]?({_LETTER})[)\].:]?(?:\s|$)"),
    # A stated answer: "Answer: B", "the answer is (B)", "정답: B", "답은 B입니다". Not \b after
    # the letter: Hangul is a word character, so "B입니다" has no word boundary.
    re.compile(
        rf"(?i:answer(?:\s+is)?|정답|답)\s*(?:은|는|:|：|-)?\s*[(\[]?({_LETTER})(?![A-Za-z])"
    ),
    re.compile(rf"[(\[]({_LETTER})[)\]]"),
)


def picked_letter(item: ProbeItem, answer: str) -> str | None:
    """The option letter an answer picks, or None when it picks none clearly."""
    text = unicodedata.normalize("NFKC", answer or "")
    for pattern in _CHOICE_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1).upper()
    got = normalize(text)
    for letter, option in zip(CHOICE_LETTERS, item.answer.choices, strict=False):
        if got == normalize(option):
            return letter
    return None


def _choice(item: ProbeItem, answer: str) -> ItemScore:
    picked = picked_letter(item, answer)
    expected = item.answer.expected.upper()
    if picked is None:
        return ItemScore(False, detail="no option letter in the answer")
    if picked == expected:
        return ItemScore(True, detail=f"picked {picked}")
    return ItemScore(False, detail=f"picked {picked}, expected {expected}")


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)


def extract_json(text: str) -> tuple[bool, Any]:
    """(found, value): the first JSON object or array, inside a ```json fence or bare."""
    text = text or ""
    decoder = json.JSONDecoder()
    candidates = [m.group(1).strip() for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        for start, char in enumerate(candidate):
            if char not in "{[":
                continue
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except json.JSONDecodeError:
                continue
            return True, value
    return False, None


def _same(expected: Any, got: Any) -> bool:
    if isinstance(expected, str):
        return isinstance(got, str) and normalize(expected) == normalize(got)
    if isinstance(expected, bool) or expected is None:
        return got is expected
    if isinstance(expected, int | float):
        if isinstance(got, str):
            got = last_number(got) if got.strip() else None
        return (
            isinstance(got, int | float)
            and not isinstance(got, bool)
            and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
        )
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same(e, g) for e, g in zip(expected, got, strict=True))
        )
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(
            k in got and _same(v, got[k]) for k, v in expected.items()
        )
    return expected == got


def _json(item: ProbeItem, answer: str) -> ItemScore:
    found, value = extract_json(answer)
    if not found:
        return ItemScore(False, json_valid=False, schema_ok=False, detail="no JSON in the answer")
    where, message = schemas.first_error(item.answer.schema or {}, value)
    if message is not None:
        detail = f"schema: {where}: {message}" if where else f"schema: {message}"
        return ItemScore(False, json_valid=True, schema_ok=False, detail=detail)
    if not isinstance(value, dict) and item.answer.fields:
        return ItemScore(False, json_valid=True, schema_ok=True, detail="not an object")
    for name, expected in (item.answer.fields or {}).items():
        if name not in value or not _same(expected, value[name]):
            return ItemScore(
                False,
                json_valid=True,
                schema_ok=True,
                detail=f"field {name!r}: expected {expected!r}, got {value.get(name)!r}",
            )
    return ItemScore(True, json_valid=True, schema_ok=True, detail="valid and matching")


def _agreement(answer: str, baseline_answer: str | None) -> ItemScore:
    if baseline_answer is None:
        return ItemScore(None, detail="no baseline answer to agree with")
    if normalize(answer) == normalize(baseline_answer):
        return ItemScore(True, detail="agrees with the baseline")
    return ItemScore(False, detail="differs from the baseline")


def score(
    item: ProbeItem, answer_text: str, baseline_answer: str | None = None, *, strict=False
) -> ItemScore:
    """Score one answer against the item's key (``baseline_answer`` for agreement items). A
    pattern of the item's that runs past its time bound (benchmarks.quality.patterns) scores
    the answer wrong, saying so; ``strict`` (the upload's own checks) raises PatternTimeout."""
    try:
        return _score(item, answer_text, baseline_answer)
    except patterns.PatternTimeout as exc:
        if strict:
            raise
        return ItemScore(False, detail=f"not scored: {exc}")


def _score(item: ProbeItem, answer_text: str, baseline_answer: str | None) -> ItemScore:
    scorer = item.answer.scorer
    answer_text = answer_text or ""
    if scorer == "exact":
        return _exact(item, answer_text)
    if scorer == "regex":
        return _regex(item, answer_text)
    if scorer == "numeric":
        return _numeric(item, answer_text)
    if scorer == "choice":
        return _choice(item, answer_text)
    if scorer == "json":
        return _json(item, answer_text)
    if scorer == "agreement":
        return _agreement(answer_text, baseline_answer)
    raise ValueError(f"unknown scorer {scorer!r}")
