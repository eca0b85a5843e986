"""Findings kept from the advisor's evaluations: a new problem opens one, a problem still seen
refreshes it, one no longer seen clears it; a dismissal needs a reason, is audited and holds
while the problem lasts; the beat sweep skips offline hosts and survives one deployment
failing; ``manage.py diagnose`` prints the findings. The rules are a stub registered here
(the real ones are tested on their own), so these tests say what the panel does with any."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from changes import tasks
from changes.advisor import engine
from changes.advisor import rules as _registered  # noqa: F401 - registered before the patch
from changes.advisor.findings import CRITICAL, WARNING, Suggestion
from changes.advisor.findings import Finding as Found
from changes.models import Finding
from changes.services import diagnosis
from controlpanel.models import AuditEntry
from tests.factories import make_config, make_deployment, make_host

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

SEEN: list[Found] = []


def stub_rule(snapshot):
    """Finds whatever the test put in SEEN (and records the deployment it was asked about)."""
    ASKED.append(snapshot.deployment)
    return list(SEEN)


ASKED: list[str] = []


def found(rule="queue-bound", severity=WARNING, waiting=12, **kw) -> Found:
    return Found(
        rule=rule,
        severity=severity,
        title=kw.pop("title", "Requests wait for a sequence slot"),
        seen=f"{waiting} requests waiting on average over the last 5 s",
        why="They queue while the GPU has room.",
        evidence={"waiting_mean": waiting},
        source="live",
        suggestion=Suggestion(settings={"max_num_seqs": 64}),
        **kw,
    )


@pytest.fixture(autouse=True)
def only_the_stub(monkeypatch, settings):
    settings.ADVISOR_SCRAPE_SECONDS = 0  # one scrape, no waiting
    monkeypatch.setattr(engine, "RULES", {"stub": stub_rule})
    SEEN.clear()
    ASKED.clear()
    yield
    SEEN.clear()


@pytest.fixture
def deployment():
    d = make_deployment(make_host(status="online"), name="llama")
    d.active_config = make_config(d, {"max_num_seqs": 4})
    d.save()
    return d


def test_a_new_problem_opens_a_finding_that_later_runs_refresh_then_clear(deployment):
    SEEN[:] = [found(waiting=12)]
    first = diagnosis.refresh(deployment, live=False)
    (row,) = first.opened
    assert (
        row.rule == "queue-bound" and row.state == "active" and row.evidence == {"waiting_mean": 12}
    )
    assert row.suggestion == {"settings": {"max_num_seqs": 64}, "action": ""}
    assert diagnosis.last_evaluation(deployment)["engine_status"] == "skipped"

    SEEN[:] = [found(waiting=30, severity=CRITICAL)]
    second = diagnosis.refresh(deployment, live=False)
    assert not second.opened and [f.pk for f in second.updated] == [row.pk]
    row.refresh_from_db()
    assert row.evidence == {"waiting_mean": 30} and row.severity == CRITICAL
    assert row.last_seen_at > row.first_seen_at and "30 requests" in row.seen

    SEEN[:] = []
    third = diagnosis.refresh(deployment, live=False)
    assert [f.pk for f in third.cleared] == [row.pk]
    row.refresh_from_db()
    assert row.state == "cleared" and row.cleared_at is not None

    # It comes back: a new finding, the old one stays in the history.
    SEEN[:] = [found()]
    (again,) = diagnosis.refresh(deployment, live=False).opened
    assert again.pk != row.pk
    assert Finding.objects.filter(deployment=deployment).count() == 2


def test_only_one_open_finding_per_rule_and_deployment(deployment):
    Finding.objects.create(
        deployment=deployment, rule="kv-bound", severity=WARNING, title="t", seen="s", why="w"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        Finding.objects.create(
            deployment=deployment, rule="kv-bound", severity=WARNING, title="t", seen="s", why="w"
        )
    # A rule reporting twice in one evaluation keeps one row (its worst).
    SEEN[:] = [found(rule="x", severity=CRITICAL), found(rule="x", severity=WARNING)]
    diagnosis.refresh(deployment, live=False)
    assert Finding.objects.get(rule="x").severity == CRITICAL


def test_dismissing_needs_a_reason_is_audited_and_holds_while_seen(deployment, operator):
    SEEN[:] = [found()]
    (row,) = diagnosis.refresh(deployment, live=False).opened
    with pytest.raises(diagnosis.DismissRefused):
        diagnosis.dismiss(operator, row, "   ")
    diagnosis.dismiss(operator, row, "The queue is the batch job's, on purpose.")
    row.refresh_from_db()
    assert row.state == "dismissed" and row.dismissed_by == operator
    entry = AuditEntry.objects.get(action="finding.dismiss")
    assert entry.actor == operator and entry.object_id == str(row.pk)
    assert entry.after["reason"] == "The queue is the batch job's, on purpose."
    with pytest.raises(diagnosis.DismissRefused):
        diagnosis.dismiss(operator, row, "again")

    # Still seen: refreshed, still dismissed, not among the active ones.
    diagnosis.refresh(deployment, live=False)
    row.refresh_from_db()
    assert row.state == "dismissed"
    assert not Finding.objects.active().exists()
    # Gone, then back: the new finding is active again.
    SEEN[:] = []
    diagnosis.refresh(deployment, live=False)
    with pytest.raises(diagnosis.DismissRefused):
        diagnosis.dismiss(operator, Finding.objects.get(pk=row.pk), "too late")
    SEEN[:] = [found()]
    diagnosis.refresh(deployment, live=False)
    assert Finding.objects.active().count() == 1


def test_a_change_of_findings_is_published_to_the_deployment_and_the_fleet(
    deployment, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(
        diagnosis, "publish", lambda group, event, data: sent.append((group, event, data))
    )
    SEEN[:] = [found()]
    with django_capture_on_commit_callbacks(execute=True):
        diagnosis.refresh(deployment, live=False)
    assert {g for g, _, _ in sent} == {f"deployment-{deployment.pk}", "advisor-fleet"}
    assert sent[0][1] == "advisor.findings" and sent[0][2]["opened"] == ["queue-bound"]
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        diagnosis.refresh(deployment, live=False)  # nothing opened or cleared: quiet
    assert sent == []


def test_the_beat_sweep_skips_offline_hosts_and_survives_a_failure(deployment, monkeypatch):
    offline = make_deployment(make_host(status="unreachable"), name="offline")
    broken = make_deployment(make_host(status="online"), name="broken")
    real_gather = diagnosis.gather

    def gather(d, **kw):
        if d.pk == broken.pk:
            raise RuntimeError("boom")
        return real_gather(d, **kw)

    monkeypatch.setattr(diagnosis, "gather", gather)
    SEEN[:] = [found()]
    result = tasks.diagnose_fleet()
    assert result["failed"] == [str(broken)] and result["evaluated"] == 1
    assert ASKED == [str(deployment)]
    assert Finding.objects.filter(deployment=deployment).exists()
    assert not Finding.objects.filter(deployment=offline).exists()


def test_the_sweep_scrapes_every_engine_once_and_in_parallel(deployment, monkeypatch):
    other = make_deployment(deployment.host, name="other")
    asked = []
    monkeypatch.setattr(
        diagnosis, "scrape_engine", lambda d, s: (asked.append(d.pk), (None, "down"))[1]
    )
    diagnosis.diagnose_fleet()
    assert sorted(asked) == sorted([deployment.pk, other.pk])
    assert diagnosis.last_evaluation(other)["engine_status"] == "unavailable"
    assert diagnosis.last_evaluation(other)["engine_error"] == "down"


def test_the_beat_task_is_scheduled_unless_turned_off():
    from django.conf import settings

    entry = settings.CELERY_BEAT_SCHEDULE["diagnose-fleet"]
    assert entry["task"] == "changes.tasks.diagnose_fleet"
    assert entry["schedule"] == settings.ADVISOR_INTERVAL_SECONDS == 60


def test_the_command_prints_the_findings(deployment):
    SEEN[:] = [found()]
    out = StringIO()
    call_command("diagnose", "llama", "--no-live", stdout=out)
    text = out.getvalue()
    assert f"{deployment}: 1 finding(s)" in text and "[WARNING] Requests wait" in text
    assert "fix:  max_num_seqs=64" in text and "12 requests waiting" in text

    out = StringIO()
    call_command("diagnose", str(deployment), "--json", "--no-live", stdout=out)
    data = json.loads(out.getvalue())
    assert data["engine_status"] == "skipped" and data["findings"][0]["rule"] == "queue-bound"
    assert Finding.objects.filter(deployment=deployment).count() == 1

    with pytest.raises(CommandError, match="No deployment"):
        call_command("diagnose", "nope", "--no-live")
