"""A probe item and its answer key: the types every part of the quality package reads (the
set's parser ``items``, the ``scorers``, the runner). Below them all, so the parser may score
an item's own reference with the scorers that read these types."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

CATEGORIES = ("factual", "reasoning", "math", "json", "format", "long_context")
LANGUAGES = ("en", "ko")
SCORERS = ("exact", "regex", "numeric", "choice", "json", "agreement")

# Uploads may add their own categories and languages; these keep them usable as group keys.
CATEGORY_RE = re.compile(r"[a-z_]{1,32}")
LANGUAGE_RE = re.compile(r"[a-z]{2,3}(-[A-Za-z0-9]{2,8})?")
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
REGEX_FLAGS = {"i": re.IGNORECASE, "s": re.DOTALL, "m": re.MULTILINE}
CHOICE_LETTERS = "ABCDE"
MAX_PROMPT_CHARS = 200_000  # ~50k tokens: longer than any context we probe, so likely a mistake
MAX_TOKENS_LIMIT = 8192


class ItemError(ValueError):
    """An item that cannot be used; the message names the field."""


@dataclass(frozen=True)
class AnswerKey:
    """How an answer is scored.

    exact: ``expected`` is a string or a list of accepted strings; ``case_sensitive``.
    regex: ``pattern`` must fullmatch the stripped answer; ``flags`` letters from "ism".
    numeric: ``expected`` a number; ``tolerance`` (absolute) and/or ``rel_tolerance``.
    choice: ``expected`` a letter A-E; ``choices`` (optional) the option texts, in order.
    json: ``schema`` a JSON Schema (Draft 2020-12); ``fields`` the expected value per key.
    agreement: no key; the candidate must say what the baseline said.
    """

    scorer: str
    expected: Any = None
    case_sensitive: bool = False
    tolerance: float | None = None
    rel_tolerance: float | None = None
    pattern: str | None = None
    flags: str = ""
    choices: tuple[str, ...] = ()
    schema: dict | None = None
    fields: dict | None = None

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"scorer": self.scorer}
        for name in ("expected", "pattern", "schema", "fields", "tolerance", "rel_tolerance"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.case_sensitive:
            out["case_sensitive"] = True
        if self.flags:
            out["flags"] = self.flags
        if self.choices:
            out["choices"] = list(self.choices)
        return out


@dataclass(frozen=True)
class ProbeItem:
    """One question with its key. Exactly one of ``messages`` and ``prompt`` is set."""

    id: str
    category: str
    language: str
    answer: AnswerKey
    messages: tuple[dict, ...] | None = None
    prompt: str | None = None
    reference: str | None = None
    wrong: str | None = None
    max_tokens: int = 64
    structured: bool = False

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"id": self.id, "category": self.category, "language": self.language}
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        else:
            out["prompt"] = self.prompt
        out["answer"] = self.answer.to_dict()
        if self.reference is not None:
            out["reference"] = self.reference
        if self.wrong is not None:
            out["wrong"] = self.wrong
        out["max_tokens"] = self.max_tokens
        if self.structured:
            out["structured"] = True
        return out
