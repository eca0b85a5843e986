"""One quality verdict, in the same words everywhere (``probes.quality_verdict``): a change's
Quality header, its timeline, the probe comparison page and the API. An FP8 switch whose
comparison could not bound the loss (240 items, 3 right only before, 2 only after) had its
header say "cannot tell" (the overall group's statistics) and its timeline "no significant
loss". And a set the engine cannot answer (0 % right on both sides) is "cannot tell: the
baseline scores 0.0 %", not a vacuous "no loss"."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from benchmarks.quality import ItemResult, compare, parse_jsonl
from benchmarks.quality.compare import MIN_BASELINE_CORRECT, baseline_floor
from benchmarks.services import probes
from changes.models import ChangeRequest
from changes.services import timeline
from changes.services.stages import QualityVerify
from tests.benchmarks.test_probe_pages import item, make_probe_run, make_probe_set
from tests.factories import make_deployment

pytestmark = pytest.mark.django_db

IDS = [f"q-{i}" for i in range(240)]


@pytest.fixture
def probe_set():
    return make_probe_set("fp8-check", [item(i) for i in IDS])


def fp8_change(probe_set, *, before_wrong, after_wrong) -> ChangeRequest:
    deployment = make_deployment()
    before = make_probe_run(deployment, probe_set, wrong=before_wrong)
    after = make_probe_run(deployment, probe_set, wrong=after_wrong)
    change = ChangeRequest.objects.create(
        deployment=deployment,
        title="FP8 weights",
        rationale="Half the memory.",
        state="verifying",
        settings={"quantization": "fp8"},
        probe_set=probe_set,
        quality_baseline=before,
        quality_run=after,
    )
    QualityVerify().run(change)  # the pipeline's stage: compares, records the timeline
    change.refresh_from_db()
    return change


def timeline_text(change) -> str:
    entries = [i for i in timeline.timeline(change) if i["after"].get("stage") == "quality"]
    return entries[-1]["message"]


def header_text(client, change) -> str:
    page = client.get(change.get_absolute_url()).content.decode()
    (verdict,) = re.findall(r'data-testid="quality-verdict">(.*?)</p>', page, re.S)
    return re.sub(r"<[^>]+>", " ", verdict)


def test_an_fp8_change_says_one_verdict_on_header_timeline_and_api(client, admin, probe_set):
    wrong = set(IDS[:40])
    change = fp8_change(
        probe_set,
        before_wrong=wrong | {"q-200", "q-201"},
        after_wrong=wrong | {"q-210", "q-211", "q-212"},
    )
    verdict = probes.quality_verdict(change.quality_comparison)
    assert verdict["verdict"] == "no significant loss"
    assert change.quality_comparison["groups"][0]["verdict"] == "cannot tell"  # the table's row
    client.force_login(admin)
    assert " ".join(header_text(client, change).split()).startswith(
        "Verdict: no significant loss no group lost significantly"
    )
    assert verdict["text"] in timeline_text(change)
    detail = client.get(f"/api/v1/changes/{change.pk}/").json()
    assert detail["quality"]["text"] == verdict["text"]
    api = client.get(
        f"/api/v1/quality-probes/{change.quality_run_id}/compare/",
        {"baseline": change.quality_baseline_id},
    ).json()
    assert (api["verdict"], api["reason"]) == (verdict["verdict"], verdict["reason"])
    page = client.get(
        reverse(
            "benchmarks:probe_compare", args=[change.quality_baseline_id, change.quality_run_id]
        )
    ).content.decode()
    assert 'data-verdict="no significant loss"' in page


def test_a_stored_comparison_is_judged_again_in_the_same_words(client, admin, probe_set):
    """A row stored before the header used the one function shows the same words too."""
    change = fp8_change(probe_set, before_wrong={"q-1", "q-2", "q-3"}, after_wrong={"q-4", "q-5"})
    stored = dict(change.quality_comparison, verdict="cannot tell", reason="old words")
    ChangeRequest.objects.filter(pk=change.pk).update(quality_comparison=stored)
    client.force_login(admin)
    assert "no significant loss" in header_text(client, change)
    assert "old words" not in header_text(client, change)


def test_a_set_the_engine_cannot_answer_cannot_tell(client, admin, probe_set):
    change = fp8_change(probe_set, before_wrong=set(IDS), after_wrong=set(IDS))
    verdict = probes.quality_verdict(change.quality_comparison)
    assert verdict["verdict"] == "cannot tell"
    assert verdict["text"].startswith(
        "cannot tell: the baseline scores 0.0 % (0 of 240 items right)"
    )
    assert change.quality_comparison["groups"][0]["verdict"] == "cannot tell"
    assert "the baseline scores 0.0 %" in timeline_text(change)
    client.force_login(admin)
    assert "cannot tell" in header_text(client, change)
    assert "no loss" not in header_text(client, change)


def pure(n: int, base_right: int, cand_right: int):
    items = parse_jsonl("\n".join(json.dumps(item(f"p-{i}")) for i in range(n))).items
    base = [ItemResult(id=it.id, correct=i < base_right) for i, it in enumerate(items)]
    cand = [ItemResult(id=it.id, correct=i < cand_right) for i, it in enumerate(items)]
    return probes.quality_verdict(compare(base, cand, items).to_dict())


def test_the_floor_is_twenty_percent_or_ten_items_and_a_loss_stays_a_loss():
    assert baseline_floor(9, 40) and baseline_floor(19, 100)  # < 10 right; < 20 %
    assert baseline_floor(MIN_BASELINE_CORRECT, 50) is None  # exactly at both floors
    assert pure(240, 9, 9)["verdict"] == "cannot tell"
    assert pure(240, 36, 0)["verdict"] == "loss"  # 15 % → 0 %: a loss is evidence still
    assert pure(240, 240, 240)["verdict"] == "no loss"
