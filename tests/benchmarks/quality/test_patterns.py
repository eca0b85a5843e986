"""User regexes run under a time bound (benchmarks.quality.patterns): `(a+)+b` against 25 `a`s
took 10.4 s of the web tier with `re` at upload and stalled /healthz; a JSON Schema `pattern`
did the same. Bounded, they refuse the item at upload and score an answer wrong in words."""

from __future__ import annotations

import json

import pytest

from benchmarks.quality import patterns
from benchmarks.quality.items import AnswerKey, ProbeItem, parse_jsonl
from benchmarks.quality.scorers import score
from tests.benchmarks.quality.test_items import line

SLOW = r"(a|aa)+b"  # exponential backtracking, in `re` and `regex` alike
SLOW_TEXT = "a" * 40


def item_with(answer: dict) -> ProbeItem:
    return ProbeItem(
        id="p",
        category="factual",
        language="en",
        answer=AnswerKey(**answer),
        messages=({"role": "user", "content": "q"},),
    )


def test_a_slow_pattern_stops_at_its_bound_with_words():
    with pytest.raises(patterns.PatternTimeout, match="took over 0.25 s on a text of 40"):
        patterns.fullmatch(SLOW, SLOW_TEXT)
    # (Unbounded, this match would run for hours: the exception is the bound holding.)
    assert patterns.fullmatch(r"Paris|Lyon", "Lyon") and not patterns.search(r"^x", "y")
    assert patterns.fullmatch(r"paris", "PARIS", patterns.FLAGS["i"])


def test_an_upload_whose_pattern_runs_away_on_its_wrong_answer_is_refused():
    slow = line(answer={"scorer": "regex", "pattern": SLOW}, reference="ab", wrong=SLOW_TEXT)
    parsed = parse_jsonl(slow)
    assert not parsed.items
    (error,) = parsed.errors
    assert "took over 0.25 s" in error.message and "must answer quickly" in error.message


def test_scoring_a_runaway_answer_scores_it_wrong_and_says_why():
    result = score(item_with({"scorer": "regex", "pattern": SLOW}), SLOW_TEXT)
    assert result.correct is False and result.detail.startswith("not scored: the pattern")


def test_a_schema_pattern_is_bounded_and_pattern_properties_refused():
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": f"^{SLOW}$"}}}
    result = score(item_with({"scorer": "json", "schema": schema}), json.dumps({"a": SLOW_TEXT}))
    assert result.correct is False and "took over 0.25 s" in result.detail
    assert score(item_with({"scorer": "json", "schema": schema}), '{"a": "aab"}').correct
    loose = {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "string"}}}
    refused = parse_jsonl(
        line(answer={"scorer": "json", "schema": loose}, reference="{}", wrong=None)
    )
    assert "patternProperties is not supported" in refused.errors[0].message
