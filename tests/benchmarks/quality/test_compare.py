"""Comparisons on synthetic results: the three verdicts and what they report."""

import json

from benchmarks.quality.compare import Comparison, ItemResult, accuracy_table, compare
from benchmarks.quality.items import AnswerKey, ProbeItem


def items(category, language, n, prefix=None, scorer="exact"):
    prefix = prefix or f"{category}-{language}"
    options = {"exact": {"expected": "x"}, "json": {"schema": {"type": "object"}}}
    key = AnswerKey(scorer=scorer, **options.get(scorer, {}))
    return [
        ProbeItem(
            id=f"{prefix}-{i}",
            category=category,
            language=language,
            answer=key,
            messages=({"role": "user", "content": f"question {i}"},),
            reference="x",
        )
        for i in range(n)
    ]


def results(its, wrong=(), **extra):
    return [
        ItemResult(
            id=i.id, answer="no" if i.id in wrong else "x", correct=i.id not in wrong, **extra
        )
        for i in its
    ]


def test_identical_runs_are_no_loss_overall_but_small_groups_cannot_tell():
    its = items("factual", "en", 150) + items("math", "ko", 150)
    base = results(its, wrong={its[0].id, its[200].id})
    cmp = compare(base, results(its, wrong={its[0].id, its[200].id}), its)
    assert cmp.verdict == "no loss"
    assert cmp.overall.n == 300 and cmp.overall.agreement == 1.0
    math = cmp.group("category:math")
    assert math.verdict == "cannot tell"
    assert "too few items (150; at least 194" in math.reason
    assert {g.key for g in cmp.groups} == {
        "overall",
        "category:factual",
        "category:math",
        "language:en",
        "language:ko",
        "factual/en",
        "math/ko",
    }
    assert cmp.changed == []


def test_ten_point_loss_on_one_category_is_a_loss_there():
    math = items("math", "en", 100)
    rest = items("factual", "en", 400)
    its = math + rest
    base = results(its, wrong={i.id for i in math[:10]})
    cand = results(its, wrong={i.id for i in math[:20]})
    cmp = compare(base, cand, its)
    g = cmp.group("category:math")
    assert (g.only_baseline, g.only_candidate, g.both_correct) == (10, 0, 80)
    assert g.baseline_accuracy == 0.9 and g.candidate_accuracy == 0.8
    assert g.mcnemar_p == 2 / 1024
    assert g.verdict == "loss" and "10.0% fewer correct" in g.reason
    assert cmp.group("category:factual").verdict == "no loss"
    # Overall 10 of 500 lost = 2 points: also beyond the 1-point threshold.
    assert cmp.verdict == "loss"
    assert len(cmp.changed) == 10
    first = cmp.changed[0]
    assert first["baseline_correct"] and not first["candidate_correct"]
    assert first["prompt"] == "question 10" and first["candidate_answer"] == "no"
    low, high = g.baseline_ci
    assert low < 0.9 < high


def test_too_few_items_cannot_tell():
    its = items("format", "ko", 20)
    cmp = compare(results(its), results(its), its)
    assert cmp.verdict == "cannot tell"
    assert "too few items" in cmp.overall.reason
    empty = compare([], [], its)
    assert (empty.overall.n, empty.verdict, empty.overall.reason) == (
        0,
        "cannot tell",
        "no paired items",
    )


def test_a_small_insignificant_loss_on_many_items_cannot_tell():
    its = items("factual", "en", 1000)
    base = results(its)
    cand = results(its, wrong={i.id for i in its[:8]})
    cmp = compare(base, cand, its)
    assert cmp.overall.verdict == "cannot tell"  # the group's statistics: not bounded
    assert "could be up to" in cmp.overall.reason
    # The comparison's one verdict (as every page says it): nothing significant, bounded.
    assert cmp.verdict == "no significant loss" == cmp.to_dict()["verdict"]


def test_unpaired_items_errors_json_rates_and_agreement():
    json_items = items("json", "en", 4, scorer="json")
    agree = items("factual", "en", 2, prefix="agree", scorer="agreement")
    its = json_items + agree
    base = results(json_items, json_valid=True, schema_ok=True)
    cand = results(json_items[:3], json_valid=True, schema_ok=True)
    cand[0] = ItemResult(id=cand[0].id, correct=False, error="ReadTimeout: ")
    cand[1] = ItemResult(id=cand[1].id, answer="x", correct=True, json_valid=True, schema_ok=False)
    base += [ItemResult(id="agree-0", answer="Blue"), ItemResult(id="agree-1", answer="Blue")]
    cand += [ItemResult(id="agree-0", answer="blue."), ItemResult(id="agree-1", answer="green")]
    base.append(ItemResult(id="not-an-item", answer="x", correct=True))
    cmp = compare(base, cand, its)
    assert cmp.only_in_baseline == [json_items[3].id]
    assert cmp.only_in_candidate == []
    o = cmp.overall
    assert o.n == 5 and o.candidate_errors == 1
    # Agreement items: the baseline is the key; "blue." agrees, "green" does not.
    assert (o.baseline_correct, o.candidate_correct) == (5, 3)
    j = cmp.group("category:json")
    assert (j.json_items, j.baseline_json_valid, j.candidate_json_valid) == (3, 1.0, 2 / 3)
    assert j.candidate_schema_ok == 1 / 3
    lost = {c["id"]: c for c in cmp.changed}
    assert lost[json_items[0].id]["candidate_answer"] == "error: ReadTimeout: "
    assert "agree-1" in lost


def test_to_dict_round_trips_through_json():
    its = items("math", "en", 30)
    cmp = compare(results(its), results(its, wrong={its[0].id}), its)
    again = Comparison.from_dict(json.loads(json.dumps(cmp.to_dict())))
    assert again == cmp
    assert again.to_dict()["verdict"] == cmp.verdict
    r = ItemResult(id="a", answer="x", correct=True, latency_ms=12.5, prompt_tokens=3)
    assert ItemResult.from_dict(r.to_dict() | {"future_field": 1}) == r


def test_accuracy_table():
    its = items("math", "en", 10) + items("math", "ko", 5)
    rows = accuracy_table(its, results(its, wrong={its[0].id}))
    assert [(r["language"], r["n"], r["correct"]) for r in rows] == [("en", 10, 9), ("ko", 5, 5)]
