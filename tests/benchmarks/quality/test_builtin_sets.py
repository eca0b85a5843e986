"""Every built-in probe item is well formed and its answer key proves itself."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from benchmarks.quality import CATEGORIES, LANGUAGES, builtin_sets, prompt_text, score
from benchmarks.quality.builtin import SETS_DIR, set_names
from benchmarks.quality.scorers import extract_json

ALL = builtin_sets()["panel-core"]
ROOT = Path(__file__).resolve().parents[3]


def _ids(items):
    return [i.id for i in items]


def test_sets_are_named_by_their_files():
    sets = builtin_sets()
    assert set(sets) == set(set_names()) | {"panel-core", "panel-quick"}
    assert len(sets["panel-core"]) == sum(len(sets[n]) for n in set_names())
    assert not any(i.category == "long_context" for i in sets["panel-quick"])


def test_ids_are_unique():
    counts = Counter(_ids(ALL))
    assert [i for i, n in counts.items() if n > 1] == []


def test_categories_and_languages_are_the_declared_ones():
    assert {i.category for i in ALL} == set(CATEGORIES)
    assert {i.language for i in ALL} == set(LANGUAGES)


def test_counts_meet_the_issue():
    cells = Counter((i.category, i.language) for i in ALL)
    knowledge = lambda lang: cells["factual", lang] + cells["reasoning", lang]  # noqa: E731
    assert knowledge("en") >= 60
    assert knowledge("ko") >= 60
    assert cells["math", "en"] + cells["math", "ko"] >= 50
    assert cells["math", "en"] and cells["math", "ko"]
    assert cells["json", "en"] + cells["json", "ko"] >= 40
    assert cells["json", "ko"] >= 15
    assert cells["format", "en"] + cells["format", "ko"] >= 30
    assert cells["long_context", "en"] + cells["long_context", "ko"] >= 10
    assert len(ALL) >= 250


@pytest.mark.parametrize("item", ALL, ids=_ids(ALL))
def test_reference_is_right_and_wrong_is_wrong(item):
    assert item.reference, "every built-in item has a reference answer"
    assert item.answer.scorer != "agreement"
    assert score(item, item.reference).correct is True
    if item.wrong is not None:
        assert score(item, item.wrong).correct is False
    assert prompt_text(item).strip()


JSON_ITEMS = [i for i in ALL if i.answer.scorer == "json"]


@pytest.mark.parametrize("item", JSON_ITEMS, ids=_ids(JSON_ITEMS))
def test_json_items_have_valid_schemas_that_their_references_meet(item):
    Draft202012Validator.check_schema(item.answer.schema)
    found, value = extract_json(item.reference)
    assert found
    assert Draft202012Validator(item.answer.schema).is_valid(value)
    assert set(item.answer.fields) <= set(item.answer.schema["properties"])
    assert item.structured


def test_korean_json_items_carry_korean_values():
    hangul = [
        i
        for i in JSON_ITEMS
        if i.language == "ko"
        and any(
            isinstance(v, str) and any("가" <= ch <= "힣" for ch in v)
            for v in i.answer.fields.values()
        )
    ]
    assert len(hangul) >= 15


LONG = [i for i in ALL if i.category == "long_context"]


@pytest.mark.parametrize("item", LONG, ids=_ids(LONG))
def test_long_documents_hold_the_fact_exactly_once(item):
    text = prompt_text(item)
    document = text.split("<document>")[1].split("</document>")[0]
    expected = item.answer.expected
    needle = str(expected) if item.answer.scorer == "numeric" else expected
    assert document.count(needle) == 1
    # Long enough to need real retrieval: ~3k tokens in English (≈4 chars a token), and
    # Korean, at about 1.5 characters a token, from ~6000 characters.
    assert len(document) >= (12000 if item.language == "en" else 6000)


def test_generated_sets_are_up_to_date():
    spec = importlib.util.spec_from_file_location(
        "make_probe_sets", ROOT / "scripts/make_probe_sets.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, text in module.render().items():
        assert (SETS_DIR / name).read_text("utf-8") == text, f"{name}: run the script"
