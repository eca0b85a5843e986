"""Scorers: forgiving about presentation, strict about content."""

import unicodedata

import pytest

from benchmarks.quality.items import AnswerKey, ProbeItem
from benchmarks.quality.scorers import extract_json, last_number, normalize, score


def make(scorer, **key):
    return ProbeItem(
        id="t",
        category="factual",
        language="en",
        answer=AnswerKey(scorer=scorer, **key),
        messages=({"role": "user", "content": "q"},),
    )


@pytest.mark.parametrize(
    "answer",
    ["Paris", "paris", "  Paris.  ", '"Paris"', "**Paris**", "Paris\n", "`paris`!"],
)
def test_exact_forgives_case_space_quotes_and_trailing_period(answer):
    assert score(make("exact", expected="Paris"), answer).correct


@pytest.mark.parametrize("answer", ["Lyon", "Paris, France", "The answer is Paris"])
def test_exact_is_strict_about_content(answer):
    assert not score(make("exact", expected="Paris"), answer).correct


def test_exact_case_sensitive_and_aliases():
    item = make("exact", expected=["NaCl", "sodium chloride"], case_sensitive=True)
    assert score(item, "NaCl").correct
    assert score(item, "sodium chloride").correct
    assert not score(item, "NACL").correct


def test_exact_korean_nfc_nfd_and_spacing():
    item = make("exact", expected="서울특별시")
    decomposed = unicodedata.normalize("NFD", "서울특별시")
    assert decomposed != "서울특별시"
    assert score(item, decomposed).correct
    assert score(item, "「서울특별시」。").correct
    assert not score(item, "서울").correct
    assert normalize("  한국  어 \t 시험 ") == "한국 어 시험"


def test_regex_fullmatch_after_strip_with_flags():
    item = make("regex", pattern=r"\d{4}-\d{2}-\d{2}")
    assert score(item, " 2024-02-29\n").correct
    assert not score(item, "Date: 2024-02-29").correct
    assert score(make("regex", pattern="yes", flags="i"), "YES").correct
    assert not score(make("regex", pattern="yes"), "YES").correct


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("1,234", 1234),
        ("The total is -5 degrees", -5),
        ("3.5 then 7.25", 7.25),
        ("정답은 1,234,567원입니다.", 1234567),
        ("답: 42개", 42),
        ("１２３", 123),  # full-width digits
        ("−8", -8),  # the Unicode minus sign
        ("no number", None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_numeric_tolerances():
    assert score(make("numeric", expected=1234), "Answer: 1,234").correct
    assert not score(make("numeric", expected=1234), "1,235").correct
    assert score(make("numeric", expected=10, tolerance=0.5), "10.4").correct
    assert score(make("numeric", expected=200, rel_tolerance=0.01), "201.9").correct
    assert not score(make("numeric", expected=200, rel_tolerance=0.01), "203").correct
    assert not score(make("numeric", expected=3), "three").correct


@pytest.mark.parametrize(
    "answer",
    [
        "B",
        "(B)",
        "b",
        "B.",
        "Answer: B",
        "The answer is (B).",
        "정답: B",
        "답은 B입니다",
        "Dolphin",
    ],
)
def test_choice_letter(answer):
    item = make("choice", expected="B", choices=("Shark", "Dolphin", "Trout"))
    assert score(item, answer).correct


def test_choice_wrong_or_missing_letter():
    item = make("choice", expected="B")
    assert score(item, "A").detail == "picked A, expected B"
    assert not score(item, "I am not sure").correct
    assert not score(item, "The answer is a bird").correct  # "a" the article, not option A
    assert score(item, "ANSWER IS B").correct


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_json_fenced_and_bare_with_korean_fields():
    item = make("json", schema=SCHEMA, fields={"name": "김민준", "age": 34})
    fenced = 'Here you go:\n```json\n{"name": "김민준", "age": 34}\n```'
    result = score(item, fenced)
    assert (result.correct, result.json_valid, result.schema_ok) == (True, True, True)
    nfd = unicodedata.normalize("NFD", '{"name": "김민준", "age": 34}')
    assert score(item, "Sure! " + nfd + " Done.").correct


def test_json_schema_failure_and_wrong_field():
    item = make("json", schema=SCHEMA, fields={"name": "Kim", "age": 34})
    bad_type = score(item, '{"name": "Kim", "age": "34"}')
    assert (bad_type.correct, bad_type.json_valid, bad_type.schema_ok) == (False, True, False)
    assert "age" in bad_type.detail
    wrong = score(item, '{"name": "Lee", "age": 34}')
    assert (wrong.correct, wrong.schema_ok) == (False, True)


@pytest.mark.parametrize("answer", ['{"name": "Kim", "age": 34', "name: Kim", "", "{'a': 1}"])
def test_malformed_json_is_invalid(answer):
    result = score(make("json", schema=SCHEMA, fields={}), answer)
    assert (result.correct, result.json_valid, result.schema_ok) == (False, False, False)


def test_extract_json_finds_the_first_array_or_object():
    assert extract_json('x [1, 2] {"a": 1}') == (True, [1, 2])
    assert extract_json('{broken} then {"a": 1}') == (True, {"a": 1})


def test_agreement_needs_a_baseline():
    item = make("agreement")
    assert score(item, "Blue.").correct is None
    assert score(item, "blue", baseline_answer="Blue.").correct is True
    assert score(item, "green", baseline_answer="blue").correct is False
