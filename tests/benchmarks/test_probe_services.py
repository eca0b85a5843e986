"""Quality probes, the panel's services without an engine: built-in sets kept in step, uploads
validated line by line, the deployment's hold, summaries, a change's verdict from a
comparison, the knowledge file simulated engines answer from."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from benchmarks.models import ProbeRun, ProbeSet
from benchmarks.quality import ItemResult, builtin_sets
from benchmarks.services import probes
from benchmarks.services import runs as benchmark_runs
from tests.factories import make_deployment, make_profile

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

GOOD = {
    "id": "q1",
    "category": "math",
    "language": "en",
    "prompt": "What is 6 times 7?",
    "answer": {"scorer": "numeric", "expected": 42},
    "reference": "42",
    "wrong": "41",
}


def jsonl(*rows) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


def test_builtin_sets_are_stored_once_and_again_only_when_they_change():
    first = probes.sync_builtin_sets()
    assert {s.name for s in first} == set(builtin_sets())
    assert probes.sync_builtin_sets() == first  # unchanged content: no new version
    core = ProbeSet.objects.get(name="panel-core")
    assert core.item_count == len(builtin_sets()["panel-core"]) and core.coverage
    assert probes.default_set() == core


def test_an_upload_names_every_bad_line_and_stores_nothing(operator):
    bad = jsonl(GOOD, {**GOOD, "id": "q1"}, {**GOOD, "id": "q3", "answer": {"scorer": "nope"}})
    with pytest.raises(probes.ProbeSetInvalid) as refused:
        probes.upload_set(operator, "mine", bad + b"\n{not json")
    lines = [line for line, _ in refused.value.errors]
    assert lines == [2, 3, 4], refused.value.errors
    assert not ProbeSet.objects.filter(name="mine").exists()


def test_uploads_are_versions_of_a_name(operator):
    one = probes.upload_set(operator, "mine", jsonl(GOOD))
    two = probes.upload_set(operator, "mine", jsonl(GOOD, {**GOOD, "id": "q2"}))
    assert (one.version, two.version, two.item_count) == (1, 2, 2)
    assert two.coverage == {"math/en": 2}


def test_a_probe_waits_for_the_engine_like_a_benchmark(operator):
    deployment = make_deployment()
    probe_set = probes.sync_builtin_sets()[0]
    with mock.patch("benchmarks.services.runs.enqueue_on_commit"):
        benchmark_runs.start_benchmark(operator, deployment, make_profile())
    with pytest.raises(probes.ProbeRefused, match="Benchmark"):
        probes.start_probe(operator, deployment, probe_set)


def test_a_running_probe_holds_the_engine(operator):
    deployment = make_deployment()
    probe_set = probes.sync_builtin_sets()[0]
    with mock.patch("benchmarks.services.probes.enqueue_on_commit") as queued:
        run = probes.start_probe(operator, deployment, probe_set, concurrency=4)
    queued.assert_called_once()
    assert run.total == probe_set.item_count and run.status == "queued"
    with pytest.raises(benchmark_runs.RunRefused, match="Quality probe"):
        benchmark_runs.start_benchmark(operator, deployment, make_profile())
    probes.cancel_probe(operator, run)
    assert ProbeRun.objects.get(pk=run.pk).status == "cancelled"


def test_summaries_count_by_category_and_language():
    items = builtin_sets()["panel-core"][:40]
    results = [ItemResult(id=i.id, correct=n % 2 == 0) for n, i in enumerate(items)]
    summary = probes.summarize(items, results)
    assert summary["overall"]["n"] == 40 and summary["overall"]["correct"] == 20
    key = f"{items[0].category}/{items[0].language}"
    assert summary[key]["n"] >= 1


def group(key, n, base, cand, verdict, p=0.5, ci=(-0.02, 0.03)):
    return {
        "key": key,
        "n": n,
        "baseline_accuracy": base,
        "candidate_accuracy": cand,
        "mcnemar_p": p,
        "loss": base - cand,
        "loss_ci": list(ci),
        "verdict": verdict,
        "reason": "r",
        "only_baseline": 2,
        "only_candidate": 1,
    }


def test_a_changes_verdict_says_exactly_what_was_shown():
    loss = {
        "groups": [
            group("overall", 274, 0.80, 0.77, "cannot tell"),
            group("language:ko", 125, 0.72, 0.62, "loss", p=0.002),
            group("json/ko", 16, 0.9, 0.7, "loss", p=0.03),
        ]
    }
    verdict = probes.quality_verdict(loss)
    assert verdict["verdict"] == "loss" and "ko 72% → 62%" in verdict["reason"]
    assert "json/ko" not in verdict["reason"]  # crossings inform, they do not decide
    fine = {"groups": [group("overall", 274, 0.80, 0.80, "cannot tell", ci=(-0.01, 0.014))]}
    verdict = probes.quality_verdict(fine)
    assert verdict["verdict"] == "no significant loss" and "1.4 pp" in verdict["reason"]
    proven = {"groups": [group("overall", 274, 0.8, 0.8, "no loss")]}
    assert probes.quality_verdict(proven)["verdict"] == "no loss"
    few = {"groups": [group("overall", 12, 0.8, 0.8, "cannot tell")]}
    assert probes.quality_verdict(few)["verdict"] == "cannot tell"


def test_the_knowledge_file_holds_questions_and_answers_only(tmp_path):
    path = tmp_path / "k.jsonl"
    count = probes.write_knowledge(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert count == len(lines) > 200
    assert set(lines[0]) == {"text", "category", "language", "answer", "wrong", "json"}
    assert any(line["json"] for line in lines) and any(line["language"] == "ko" for line in lines)
    assert not any("id" in line for line in lines)  # recognised by content, never by an id


def test_runs_of_different_set_versions_do_not_compare(operator):
    deployment = make_deployment()
    one = probes.upload_set(operator, "mine", jsonl(GOOD))
    two = probes.upload_set(operator, "mine", jsonl(GOOD, {**GOOD, "id": "q2"}))
    a = ProbeRun.objects.create(deployment=deployment, probe_set=one, status="succeeded")
    b = ProbeRun.objects.create(deployment=deployment, probe_set=two, status="cancelled")
    with pytest.raises(probes.ProbeRefused, match="same set version"):
        probes.compare_runs(a, b)
