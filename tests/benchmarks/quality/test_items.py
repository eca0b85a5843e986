"""Uploaded probe sets: every bad line gets one clear error, good lines still load."""

import json

from benchmarks.quality.items import item_from_dict, parse_jsonl, prompt_text, to_jsonl

GOOD = {
    "id": "q1",
    "category": "factual",
    "language": "en",
    "messages": [{"role": "user", "content": "Capital of France?"}],
    "answer": {"scorer": "exact", "expected": "Paris"},
    "reference": "Paris",
    "wrong": "Lyon",
}


def line(**changes):
    data = {**GOOD, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not None}, ensure_ascii=False)


def errors_of(*lines):
    parsed = parse_jsonl("\n".join(lines))
    return {e.line: e.message for e in parsed.errors}, parsed.items


def test_good_line_round_trips():
    parsed = parse_jsonl(line())
    assert parsed.ok
    (item,) = parsed.items
    assert prompt_text(item) == "Capital of France?"
    again = parse_jsonl(to_jsonl(parsed.items))
    assert again.items == parsed.items
    assert item_from_dict(item.to_dict()) == item


def test_each_problem_named_with_its_line():
    errors, items = errors_of(
        line(id="ok-1"),
        "{not json",
        line(id="q2", category=None),
        line(id="q3", answer={"scorer": "fuzzy", "expected": "x"}),
        line(id="q4", answer={"scorer": "regex", "pattern": "(unclosed"}),
        line(id="q5", answer={"scorer": "json", "schema": {"type": "objekt"}}),
        line(id="q6", reference="Lyon", wrong=None),
        line(id="ok-1"),
        line(id="q8", messages=[{"role": "user", "content": "x" * 200_001}]),
        line(id="q9", reference=None),
        line(id="q10", wrong="paris."),
        line(id="q11", language="Korean"),
        line(id="q12", category="Fact-Check"),
        line(id="q13", prompt="also a prompt"),
        line(id="q14", max_tokens=0),
    )
    assert [i.id for i in items] == ["ok-1"]
    assert errors[2].startswith("bad JSON")
    assert errors[3] == "missing field 'category'"
    assert "unknown scorer 'fuzzy'" in errors[4]
    assert errors[5].startswith("regex: bad pattern")
    assert errors[6].startswith("json: bad JSON Schema")
    assert "reference answer fails its own scorer" in errors[7]
    assert errors[8] == "duplicate id 'ok-1' (first on line 1)"
    assert errors[9].startswith("prompt too long")
    assert "missing field 'reference'" in errors[10]
    assert errors[11] == "the 'wrong' answer is scored correct"
    assert errors[12].startswith("bad language")
    assert errors[13].startswith("bad category")
    assert errors[14] == "give exactly one of 'messages' and 'prompt'"
    assert errors[15].startswith("'max_tokens' must be")


def test_users_may_add_categories_languages_and_agreement_items():
    parsed = parse_jsonl(
        line(
            category="legal_terms",
            language="pt-BR",
            answer={"scorer": "agreement"},
            reference=None,
            wrong=None,
        )
    )
    assert parsed.ok, parsed.errors


def test_too_many_items_and_blank_lines_and_bytes():
    data = (line(id="a") + "\n\n" + line(id="b") + "\n" + line(id="c")).encode()
    parsed = parse_jsonl(data, max_items=2)
    assert [i.id for i in parsed.items] == ["a", "b"]
    assert [(e.line, e.message) for e in parsed.errors] == [(4, "too many items (at most 2)")]
    assert parse_jsonl(b"\xff\xfe").errors[0].message.startswith("not UTF-8")
    assert parse_jsonl("").errors[0].message == "no items"


def test_prompt_items_and_structured_only_for_json():
    parsed = parse_jsonl(
        line(
            messages=None,
            prompt="2+2=",
            answer={"scorer": "numeric", "expected": 4},
            reference="4",
            wrong="5",
        )
    )
    assert parsed.ok
    assert prompt_text(parsed.items[0]) == "2+2="
    errors, _ = errors_of(line(structured=True))
    assert "only for json items" in errors[1]


def test_text_no_database_stores_is_a_line_error_not_a_500():
    # A NUL (PostgreSQL refuses it) and a lone surrogate (not UTF-8) were 500s at upload.
    nul = line(messages=[{"role": "user", "content": "a\u0000b"}])
    lone = line(id="q2").replace("Capital of France?", "Capital\\ud800?")
    errors, items = errors_of(nul, lone, line(id="q3"))
    assert errors == {
        1: "a NUL character (\\u0000) in a text: not allowed",
        2: "a lone surrogate (\\ud800-\\udfff without its pair) in a text: not UTF-8",
    }
    assert [i.id for i in items] == ["q3"]
