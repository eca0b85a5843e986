"""Issue 14 item 9: one row-locked rule for what may use a deployment now
(``hosts.services.occupancy``). A restart or apply is refused while a benchmark measures the
engine or a change holds its lock; a benchmark is refused while a change holds it, unless the
change's own pipeline asks; a change cannot start while anything else uses the engine. (The
same rule under real concurrency on PostgreSQL: tests/integration/test_deployment_occupancy.py.)
"""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import transaction

from benchmarks.services import runs
from changes import rules
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import review
from hosts.models import EngineOperation
from hosts.services import occupancy, operations
from tests.factories import (
    make_config,
    make_deployment,
    make_gpu,
    make_host,
    make_profile,
    make_run,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_tasks():
    """Requests are queued, never run: what is tested is whether they are accepted."""
    with mock.patch("controlpanel.jobs.enqueue") as enqueue:
        yield enqueue


@pytest.fixture
def deployment():
    host = make_host()
    make_gpu(host)
    deployment = make_deployment(host)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


def holding_change(operator, approver, deployment, state="applying") -> ChangeRequest:
    """A change whose pipeline holds the deployment's lock (applying, or verifying)."""
    change = review.propose_change(
        operator,
        deployment,
        title="More sequences",
        rationale="Queue wait dominates TTFT at peak.",
        settings={"max_num_seqs": 128},
    )
    review.approve_change(approver, change)
    change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    ChangeRequest.objects.filter(pk=change.pk).update(state=state)
    return ChangeRequest.objects.get(pk=change.pk)


def test_every_app_registers_what_holds_a_deployment():
    assert occupancy.holders() == (
        "hosts.operation",
        "benchmarks.run",
        "benchmarks.probe",
        "changes.lock",
        "changes.sweep",
    )


@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_restart_or_apply_during_a_benchmark_is_refused_naming_it(operator, deployment, status):
    run = make_run(deployment, status=status, label="nightly", requested_by=operator)
    with pytest.raises(operations.OperationRefused) as refused:
        operations.request_operation(operator, deployment, "restart")
    assert str(refused.value) == (
        f"Cannot restart {deployment} now: Benchmark #{run.pk} nightly by {operator} is "
        f"{status}: one benchmark at a time per engine, and nothing changes an engine while it "
        "is measured."
    )
    other = make_config(deployment, {"max_num_seqs": 32})
    with pytest.raises(operations.OperationRefused, match="Cannot apply a config to"):
        operations.request_operation(operator, deployment, "apply", other)
    assert not EngineOperation.objects.filter(deployment=deployment).exists()


@pytest.mark.parametrize("state", ["applying", "verifying"])
def test_a_restart_while_a_change_holds_the_lock_is_refused_but_its_own_pipeline_may(
    operator, approver, deployment, state
):
    change = holding_change(operator, approver, deployment, state)
    with pytest.raises(operations.OperationRefused) as refused:
        operations.request_operation(operator, deployment, "restart")
    message = str(refused.value)
    assert f"locked by change #{change.pk} (More sequences), {state}" in message
    assert "only the change's own pipeline restarts or measures the engine" in message
    # The pipeline's own restart (or rollback) is the holder's: allowed.
    own = operations.request_operation(operator, deployment, "restart", owner=change)
    assert own.status == "queued"


def test_a_benchmark_from_outside_a_changes_pipeline_is_refused_its_own_is_not(
    operator, approver, deployment
):
    change = holding_change(operator, approver, deployment, "verifying")
    profile = make_profile()
    with pytest.raises(runs.RunRefused, match=f"locked by change #{change.pk}"):
        runs.start_benchmark(operator, deployment, profile)
    verification = runs.start_benchmark(operator, deployment, profile, owner=change)
    assert verification.status == "queued"


def test_a_changes_own_runs_and_operations_are_its_own(operator, approver, deployment):
    # The pipeline's worker died during the baseline: its run still says running. Its rollback
    # (owner: the change) may restart the engine; anyone else is told about both holders.
    change = holding_change(operator, approver, deployment)
    baseline = make_run(deployment, status="running", label="change baseline")
    ChangeRequest.objects.filter(pk=change.pk).update(baseline_run=baseline)
    change.refresh_from_db()
    with pytest.raises(operations.OperationRefused) as refused:
        operations.request_operation(operator, deployment, "restart")
    assert f"Benchmark #{baseline.pk}" in str(refused.value)
    assert f"locked by change #{change.pk}" in str(refused.value)
    assert operations.request_operation(None, deployment, "restart", owner=change)


def test_another_change_or_someone_elses_run_is_not_a_changes_own(operator, approver, deployment):
    change = holding_change(operator, approver, deployment)
    stranger = make_run(deployment, status="running")
    with pytest.raises(operations.OperationRefused, match=f"Benchmark #{stranger.pk}"):
        operations.request_operation(None, deployment, "restart", owner=change)


def test_a_change_cannot_start_while_a_benchmark_measures_the_engine(
    operator, approver, deployment
):
    change = review.propose_change(
        operator, deployment, title="t", rationale="r", settings={"max_num_seqs": 128}
    )
    review.approve_change(approver, change)
    run = make_run(deployment, status="running")
    with pytest.raises(rules.ChangeRefused) as refused:
        change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    assert str(refused.value).startswith(f"Cannot start applying a change to {deployment} now: ")
    assert f"Benchmark #{run.pk}" in str(refused.value)
    assert ChangeRequest.objects.get(pk=change.pk).state == "approved"


def test_a_benchmark_during_an_operation_is_refused_naming_it(operator, deployment):
    operation = operations.request_operation(operator, deployment, "restart")
    with pytest.raises(runs.RunRefused) as refused:
        runs.start_benchmark(operator, deployment, make_profile())
    assert f"Restart engine #{operation.pk} by {operator} is queued" in str(refused.value)
    assert "once the engine has settled" in str(refused.value)


@pytest.mark.django_db(transaction=True)
def test_the_check_must_run_in_the_transaction_that_locks_the_deployment(deployment):
    with pytest.raises(RuntimeError, match="row-locks the deployment"):
        occupancy.require_free(deployment, occupancy.Purpose.RUN)
    with transaction.atomic():
        occupancy.require_free(deployment, occupancy.Purpose.RUN)  # free: no error


def test_a_new_kind_of_holder_is_one_registration(monkeypatch, operator, deployment):
    # What a tuning sweep will do: register its holder; every entry point then respects it.
    monkeypatch.setattr(occupancy, "_HOLDERS", dict(occupancy._HOLDERS))
    sweep = deployment.host  # any row stands for the sweep here

    def sweeps(d):
        text = "Sweep 'batch sizes' is trying configs on it."
        return [occupancy.Occupant(sweep, text)] if d.pk == deployment.pk else []

    occupancy.register("sweeps.sweep", sweeps)
    with pytest.raises(runs.RunRefused, match="Sweep 'batch sizes'"):
        runs.start_benchmark(operator, deployment, make_profile())
    assert runs.start_benchmark(operator, deployment, make_profile(), owner=sweep)
