"""The one task lifecycle (``controlpanel.jobs``) and the one home of time limits
(``controlpanel.timelimits``)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from controlpanel import timelimits
from controlpanel.jobs import enqueue, enqueue_on_commit, run_job
from controlpanel.models import AuditEntry, WorkClaim


class Row:
    """A row stand-in: its model's label and key are what its work claim is held by."""

    _meta = SimpleNamespace(label_lower="tests.row")

    def __init__(self, finished=False):
        self.is_finished = finished
        self.pk = 1


class Rows:
    """A queryset stand-in: ``filter(pk=…).first()``."""

    def __init__(self, row):
        self.row = row

    def filter(self, pk):
        return self

    def first(self):
        return self.row


def test_a_missing_or_finished_row_is_skipped():
    work = mock.Mock()
    assert run_job(Rows(None), 1, work, mock.Mock()) is None
    assert run_job(Rows(Row(finished=True)), 1, work, mock.Mock()) is None
    work.assert_not_called()


@pytest.mark.django_db
def test_the_work_runs_and_its_result_comes_back():
    row = Row()
    assert run_job(Rows(row), 1, lambda r: ("done", r), mock.Mock()) == ("done", row)


@pytest.mark.django_db
def test_the_work_holds_a_claim_while_it_runs_and_drops_it_after():
    seen = []

    def work(r):
        seen.extend(WorkClaim.objects.values_list("kind", "object_id"))
        raise ValueError("broken")

    with pytest.raises(ValueError):
        run_job(Rows(Row()), 1, work, mock.Mock())
    assert seen == [("tests.row", 1)]
    assert not WorkClaim.objects.exists()


@pytest.mark.django_db
def test_a_time_limit_is_recorded_on_the_row_and_not_raised():
    fail = mock.Mock()
    row = Row()

    def slow(r):
        raise SoftTimeLimitExceeded()

    assert run_job(Rows(row), 1, slow, fail, what="the check") is None
    fail.assert_called_once_with(row, "the check ran out of time")


@pytest.mark.django_db
def test_an_error_is_recorded_on_the_row_and_raised_for_the_worker_log():
    fail = mock.Mock()
    row = Row()

    def broken(r):
        raise KeyError("gpu")

    with pytest.raises(KeyError):
        run_job(Rows(row), 1, broken, fail)
    fail.assert_called_once_with(row, "KeyError: 'gpu'")


@pytest.mark.django_db
def test_a_custom_finished_rule():
    work = mock.Mock(return_value=1)
    assert run_job(Rows(Row()), 1, work, mock.Mock(), finished=lambda r: True) is None
    assert run_job(Rows(Row(True)), 1, work, mock.Mock(), finished=lambda r: False) == 1


def test_enqueue_finds_the_task_by_name_and_sends_its_options():
    with mock.patch("hosts.tasks.check_host.apply_async") as sent:
        enqueue("hosts.tasks.check_host", 7, soft_time_limit=5, time_limit=9)
    sent.assert_called_once_with((7,), soft_time_limit=5, time_limit=9)


def test_an_unknown_task_name_fails_loudly():
    with pytest.raises((ImportError, KeyError)):
        enqueue("hosts.tasks.no_such_task", 1)


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_waits_for_the_commit():
    from django.db import transaction

    with mock.patch("hosts.tasks.check_host.apply_async") as sent:
        with transaction.atomic():
            enqueue_on_commit("hosts.tasks.check_host", 3)
            AuditEntry.objects.create(action="x")
            sent.assert_not_called()
        sent.assert_called_once_with((3,))


# --- time limits ---------------------------------------------------------------------------------
def test_a_benchmark_budget_follows_its_plan_up_to_the_cap():
    assert timelimits.benchmark_budget(50, 3600) == 50 * 3 + 300
    assert timelimits.benchmark_budget(5000, 3600) == 3600
    assert timelimits.benchmark_budget(None, 3600) == 3600  # an unknown length: the cap
    assert timelimits.benchmark(450).options() == {"soft_time_limit": 510, "time_limit": 570}


def test_a_pipeline_holds_two_benchmarks_three_operations_and_the_health_check():
    # Operations: the restart before the baseline, the change's apply, a rollback.
    limit = timelimits.pipeline(450, 1320, 30)
    assert limit.soft == 2 * 450 + 3 * 1320 + 30 + 300 and limit.hard == limit.soft + 60


def test_the_visibility_timeout_outlasts_every_task_it_can_be_given():
    kw = dict(benchmark_max=36000, ready_timeout=600, health_timeout=30, default_hard=900)
    timeout = timelimits.visibility_timeout(**kw)
    budget = timelimits.operation_budget(600)
    for limit in (
        timelimits.benchmark(36000),
        timelimits.operation(600),
        timelimits.pipeline(36000, budget, 30),
        timelimits.DEFAULT_PIPELINE,
        timelimits.DOWNSAMPLE_TELEMETRY,
    ):
        assert limit.soft < limit.hard < timeout
