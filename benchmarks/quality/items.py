"""Probe items: what a quality probe asks, and the key that says whether an answer is right.

A probe set is versioned data, one JSON object per line (JSONL)::

    {"id": "geo-en-001", "category": "factual", "language": "en",
     "messages": [{"role": "user", "content": "Capital of France? One word."}],
     "answer": {"scorer": "exact", "expected": "Paris"},
     "reference": "Paris", "wrong": "Lyon", "max_tokens": 16}

``prompt`` (a plain completion prompt) may replace ``messages``. ``answer.scorer`` is one of
``SCORERS``; its options are described on ``AnswerKey``. ``reference`` is an example of a correct
answer and is required for every scorer but "agreement": a set whose own reference fails its
scorer is refused, so a typo in a key cannot silently turn into "the model got worse".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import regex

from benchmarks.quality import patterns, schemas
from benchmarks.quality.item import (  # noqa: F401 - the probe set's names, re-exported
    CATEGORIES,
    CATEGORY_RE,
    CHOICE_LETTERS,
    ID_RE,
    LANGUAGE_RE,
    LANGUAGES,
    MAX_PROMPT_CHARS,
    MAX_TOKENS_LIMIT,
    REGEX_FLAGS,
    SCORERS,
    AnswerKey,
    ItemError,
    ProbeItem,
)
from benchmarks.quality.scorers import score


@dataclass
class LineError:
    """A problem with one line of an uploaded set (1-based line number)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ProbeSetParse:
    """What ``parse_jsonl`` made of a file: the good items and one error per bad line."""

    items: list[ProbeItem] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def prompt_text(item: ProbeItem) -> str:
    """The text the model's last user turn carries (or the prompt): what a simulator keys on."""
    if item.prompt is not None:
        return item.prompt
    for message in reversed(item.messages or ()):
        if message.get("role") == "user":
            return message.get("content", "")
    return ""


def _need(data: dict, name: str, kind: type | tuple, what: str) -> Any:
    if name not in data:
        raise ItemError(f"missing field {name!r}")
    value = data[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ItemError(f"{name!r} must be {what}")
    return value


def _number(data: dict, name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ItemError(f"answer.{name} must be a non-negative number")
    return float(value)


def _answer_key(data: Any) -> AnswerKey:
    if not isinstance(data, dict):
        raise ItemError("'answer' must be an object with a 'scorer'")
    scorer = data.get("scorer")
    if scorer not in SCORERS:
        raise ItemError(f"unknown scorer {scorer!r} (one of {', '.join(SCORERS)})")
    known = {
        "scorer",
        "expected",
        "case_sensitive",
        "tolerance",
        "rel_tolerance",
        "pattern",
        "flags",
        "choices",
        "schema",
        "fields",
    }
    extra = sorted(set(data) - known)
    if extra:
        raise ItemError(f"unknown answer option(s): {', '.join(extra)}")
    expected = data.get("expected")
    flags = data.get("flags", "")
    if not isinstance(flags, str) or set(flags) - set(REGEX_FLAGS):
        raise ItemError("answer.flags must be letters from 'ism'")
    choices = data.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ItemError("answer.choices must be a list of strings")
    if len(choices) > len(CHOICE_LETTERS):
        raise ItemError(f"at most {len(CHOICE_LETTERS)} choices")
    key = AnswerKey(
        scorer=scorer,
        expected=expected,
        case_sensitive=bool(data.get("case_sensitive", False)),
        tolerance=_number(data, "tolerance"),
        rel_tolerance=_number(data, "rel_tolerance"),
        pattern=data.get("pattern"),
        flags=flags,
        choices=tuple(choices),
        schema=data.get("schema"),
        fields=data.get("fields"),
    )
    _check_key(key)
    return key


def _check_key(key: AnswerKey) -> None:
    expected = key.expected
    if key.scorer == "exact":
        ok = isinstance(expected, str) and expected.strip()
        ok = ok or (
            isinstance(expected, list)
            and expected
            and all(isinstance(e, str) and e.strip() for e in expected)
        )
        if not ok:
            raise ItemError("exact: 'expected' must be a non-empty string or list of strings")
    elif key.scorer == "regex":
        if not isinstance(key.pattern, str) or not key.pattern:
            raise ItemError("regex: 'pattern' is required")
        try:
            patterns.compiled(key.pattern)
        except regex.error as exc:
            raise ItemError(f"regex: bad pattern: {exc}") from None
    elif key.scorer == "numeric":
        if isinstance(expected, bool) or not isinstance(expected, int | float):
            raise ItemError("numeric: 'expected' must be a number")
    elif key.scorer == "choice":
        if not isinstance(expected, str) or expected.upper() not in CHOICE_LETTERS:
            raise ItemError("choice: 'expected' must be a letter A-E")
        if key.choices and CHOICE_LETTERS.index(expected.upper()) >= len(key.choices):
            raise ItemError("choice: 'expected' is beyond the listed choices")
    elif key.scorer == "json":
        _check_json_key(key)


def _check_json_key(key: AnswerKey) -> None:
    problem = schemas.schema_problem(key.schema)
    if problem is not None:
        raise ItemError(f"json: {problem}")
    if key.fields is not None and not isinstance(key.fields, dict):
        raise ItemError("json: 'fields' must be an object")


def _messages(value: Any) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise ItemError("'messages' must be a non-empty list")
    out = []
    for i, message in enumerate(value):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("system", "user", "assistant")
            or not isinstance(message.get("content"), str)
        ):
            raise ItemError(
                f"messages[{i}] must be {{'role': system|user|assistant, 'content': text}}"
            )
        out.append({"role": message["role"], "content": message["content"]})
    if out[-1]["role"] != "user":
        raise ItemError("the last message must be the user's")
    return tuple(out)


def item_from_dict(data: Any) -> ProbeItem:
    """One item from its JSON object; raises ``ItemError`` naming the first problem."""
    if not isinstance(data, dict):
        raise ItemError("each line must be a JSON object")
    item_id = _need(data, "id", str, "a string")
    if not ID_RE.fullmatch(item_id):
        raise ItemError(f"bad id {item_id!r} (letters, digits, . _ : -; at most 128)")
    category = _need(data, "category", str, "a string")
    if not CATEGORY_RE.fullmatch(category):
        raise ItemError(f"bad category {category!r} (lowercase letters and _, at most 32)")
    language = _need(data, "language", str, "a string")
    if not LANGUAGE_RE.fullmatch(language):
        raise ItemError(f"bad language {language!r} (a short code such as en, ko, pt-BR)")
    if ("messages" in data) == ("prompt" in data):
        raise ItemError("give exactly one of 'messages' and 'prompt'")
    messages = _messages(data["messages"]) if "messages" in data else None
    prompt = data.get("prompt")
    if messages is None and (not isinstance(prompt, str) or not prompt):
        raise ItemError("'prompt' must be a non-empty string")
    text_len = len(prompt or "") + sum(len(m["content"]) for m in messages or ())
    if text_len > MAX_PROMPT_CHARS:
        raise ItemError(f"prompt too long ({text_len} characters; at most {MAX_PROMPT_CHARS})")
    key = _answer_key(data.get("answer"))
    reference = data.get("reference")
    wrong = data.get("wrong")
    for name, value in (("reference", reference), ("wrong", wrong)):
        if value is not None and not isinstance(value, str):
            raise ItemError(f"{name!r} must be a string")
    if key.scorer != "agreement" and reference is None:
        raise ItemError("missing field 'reference' (an example correct answer)")
    max_tokens = data.get("max_tokens", 64)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ItemError("'max_tokens' must be an integer")
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise ItemError(f"'max_tokens' must be 1..{MAX_TOKENS_LIMIT}")
    structured = data.get("structured", False)
    if not isinstance(structured, bool) or (structured and key.scorer != "json"):
        raise ItemError("'structured' is a boolean and only for json items")
    item = ProbeItem(
        id=item_id,
        category=category,
        language=language,
        answer=key,
        messages=messages,
        prompt=prompt if messages is None else None,
        reference=reference,
        wrong=wrong,
        max_tokens=max_tokens,
        structured=structured,
    )
    _check_reference(item)
    return item


def _check_reference(item: ProbeItem) -> None:
    try:
        if item.reference is not None and item.answer.scorer != "agreement":
            verdict = score(item, item.reference, strict=True)
            if not verdict.correct:
                raise ItemError(f"the reference answer fails its own scorer ({verdict.detail})")
        if item.wrong is not None and item.answer.scorer != "agreement":
            if score(item, item.wrong, strict=True).correct:
                raise ItemError("the 'wrong' answer is scored correct")
    except patterns.PatternTimeout as exc:
        raise ItemError(f"{exc}: a probe's patterns must answer quickly") from None


def parse_jsonl(data: bytes | str, *, max_items: int = 5000) -> ProbeSetParse:
    """Parse a probe set; every bad line gets one error and the good lines still come back."""
    result = ProbeSetParse()
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            result.errors.append(LineError(1, f"not UTF-8 text ({exc.reason})"))
            return result
    seen: dict[str, int] = {}
    count = 0
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        count += 1
        if count > max_items:
            result.errors.append(LineError(number, f"too many items (at most {max_items})"))
            break
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            result.errors.append(LineError(number, f"bad JSON: {exc.msg} at column {exc.colno}"))
            continue
        bad_text = _unstorable_text(raw)
        if bad_text:
            result.errors.append(LineError(number, bad_text))
            continue
        try:
            item = item_from_dict(raw)
        except ItemError as exc:
            result.errors.append(LineError(number, str(exc)))
            continue
        if item.id in seen:
            result.errors.append(
                LineError(number, f"duplicate id {item.id!r} (first on line {seen[item.id]})")
            )
            continue
        seen[item.id] = number
        result.items.append(item)
    if count == 0 and not result.errors:
        result.errors.append(LineError(1, "no items"))
    return result


def _unstorable_text(value: Any) -> str | None:
    """Why a parsed line holds text no database stores, or None: a NUL character (PostgreSQL
    refuses it in text and JSON) or a lone surrogate (not UTF-8: both databases refuse it).
    Each was a 500 at upload (issue 38)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            if "\x00" in node:
                return "a NUL character (\\u0000) in a text: not allowed"
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return "a lone surrogate (\\ud800-\\udfff without its pair) in a text: not UTF-8"
    return None


def to_jsonl(items: list[ProbeItem]) -> str:
    """The set as JSONL text (UTF-8, Korean kept readable), one item per line."""
    return "".join(json.dumps(i.to_dict(), ensure_ascii=False) + "\n" for i in items)
