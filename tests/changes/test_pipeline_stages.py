"""The apply pipeline's stages and their driver, every failure and resume path, against a fake
host (scripted apply outcomes), a scripted health check and scripted benchmark results.

The same pipeline against a real agent and real simulated engines is
``test_pipeline_agent.py`` (integration)."""

from __future__ import annotations

from unittest import mock

import pytest

from changes.choices import Stage, StageStatus
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import pipeline, review, stages, verification
from changes.services.stages import PipelineStage, StageFailed
from controlpanel.models import AuditEntry
from hosts.models import EngineConfig, EngineOperation
from hosts.transport.base import ApplyOutcome
from tests.factories import make_config, make_deployment, make_finished_run, make_host, make_profile

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

GOOD_NUMBERS = {"ttft_p95_ms": 300.0, "itl_p95_ms": 20.0, "error_rate": 0.0}


class FakeHost:
    """A host's transport: each apply takes the next scripted outcome (``ready`` when the
    script runs out); remembers which config versions it was asked to run."""

    def __init__(self):
        self.script: list[ApplyOutcome] = []
        self.applied: list[dict] = []
        self.restarts = 0  # the restart before a fresh baseline
        self.state = "ready"

    def apply_config(self, name, launch, *, previous, ready_timeout_s):
        self.applied.append(launch.settings)
        outcome = self.script.pop(0) if self.script else ApplyOutcome("ready")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def restart_engine(self, name, *, ready_timeout_s):
        self.restarts += 1
        return ApplyOutcome("ready")

    def engine_status(self, name):
        return {"name": name, "state": self.state}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Bench:
    """Scripted benchmarks: ``numbers[purpose]`` are the run's headline numbers, ``status``
    its end; ``during`` runs inside the benchmark (e.g. someone asks for a rollback)."""

    def __init__(self):
        self.numbers = {"baseline": dict(GOOD_NUMBERS), "verification": dict(GOOD_NUMBERS)}
        self.status = {"baseline": "succeeded", "verification": "succeeded"}
        self.during = {}
        self.calls: list[str] = []

    def __call__(self, change, purpose):
        self.calls.append(purpose)
        if purpose in self.during:
            self.during[purpose](change)
        run = make_finished_run(
            change.deployment,
            load_profile=change.verify_profile,
            status=self.status[purpose],
            error="engine gone" if self.status[purpose] != "succeeded" else "",
            **self.numbers[purpose],
        )
        field = verification.BENCHMARK_FIELDS[purpose]
        setattr(change, field, run)
        change.save(update_fields=[field])
        return run, ""


@pytest.fixture
def host(monkeypatch, settings):
    settings.CHANGE_HEARTBEAT_SECONDS = 3600  # no heartbeat thread writes during a test
    fake = FakeHost()
    monkeypatch.setattr("hosts.services.operations.transport_for", lambda h, d=None: fake)
    monkeypatch.setattr("hosts.services.transports.transport_for", lambda h, d=None: fake)
    return fake


@pytest.fixture
def health(monkeypatch):
    answers: list = []
    monkeypatch.setattr(
        verification,
        "health_problem",
        lambda deployment, config=None: answers.pop(0) if answers else None,
    )
    return answers


@pytest.fixture
def bench(monkeypatch):
    fake = Bench()
    monkeypatch.setattr(verification, "run_benchmark", fake)
    return fake


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host())
    config = make_config(deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.9})
    deployment.active_config = config
    deployment.save()
    return deployment


def applying(operator, approver, deployment, *, verify=True, settings=None) -> ChangeRequest:
    """A change approved and queued (the task itself is not sent)."""
    proposed = dict(deployment.active_config.settings)
    proposed.update(settings or {"max_num_seqs": 128})
    change = review.propose_change(
        operator,
        deployment,
        title="More sequences",
        rationale="Queue wait dominates TTFT at peak.",
        settings=proposed,
        verify_profile=make_profile() if verify else None,
    )
    review.approve_change(approver, change)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    return ChangeRequest.objects.get(pk=change.pk)


def run(change, stage_list=None) -> ChangeRequest:
    return pipeline.run_pipeline(change.pk, "worker-1", stages=stage_list)


def steps(change) -> list[tuple[str, str]]:
    rows = AuditEntry.objects.filter(object_id=str(change.pk), action="change.stage").order_by("pk")
    return [(e.after["stage"], e.after["status"]) for e in rows]


def ask_for_rollback(change) -> None:
    """Someone presses "Roll back now" (from another request: only the row changes)."""
    ChangeRequest.objects.filter(pk=change.pk).update(rollback_requested=True)


def versions(host) -> list[int]:
    return [s["max_num_seqs"] for s in host.applied]


# --- the good path -------------------------------------------------------------------------------
def test_a_good_change_runs_every_stage_in_order(
    operator, approver, deployment, host, health, bench
):
    change = run(applying(operator, approver, deployment))

    assert change.state == "applied", change.outcome
    order = ["snapshot", "prepare", "baseline", "apply", "restart", "health", "verify", "compare"]
    assert steps(change) == [
        step for name in order for step in ((name, "started"), (name, "succeeded"))
    ] + [("done", "succeeded")]
    assert versions(host) == [128]
    deployment.refresh_from_db()
    assert deployment.active_config == change.applied_config
    assert change.comparison["regressed"] is False
    assert change.comparison["outcome"] == "verified"
    assert bench.calls == ["baseline", "verification"]
    assert host.restarts == 1  # before the baseline: it starts cold, as the verification does


def test_without_a_profile_verification_is_skipped(operator, approver, deployment, host, health):
    change = run(applying(operator, approver, deployment, verify=False))

    assert change.state == "applied"
    assert ("verify", "skipped") in steps(change)
    assert not any(name in ("baseline", "compare") for name, _ in steps(change))


# --- failures before anything changed ------------------------------------------------------------
def test_a_stale_change_changes_nothing(operator, approver, deployment, host, health, bench):
    change = applying(operator, approver, deployment)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 32})
    deployment.save()

    change = run(change)

    assert change.state == "failed" and "Nothing was changed" in change.outcome
    assert steps(change)[-1] == ("snapshot", "failed")
    assert host.applied == [] and bench.calls == []


def test_a_failed_baseline_changes_nothing(operator, approver, deployment, host, health, bench):
    bench.status["baseline"] = "failed"
    before = EngineConfig.objects.filter(deployment=deployment).count()

    change = run(applying(operator, approver, deployment))

    assert change.state == "failed"
    assert change.outcome == "the baseline benchmark failed: engine gone Nothing was changed."
    assert steps(change)[-1] == ("baseline", "failed")
    assert host.applied == []
    assert EngineConfig.objects.filter(deployment=deployment).count() == before


def test_a_refused_restart_changes_nothing(operator, approver, deployment, host, health, bench):
    # Without a profile: the restart before a baseline (refused the same way) is not run.
    change = applying(operator, approver, deployment, verify=False)
    EngineOperation.objects.create(
        deployment=deployment, kind="restart", config=deployment.active_config, status="running"
    )

    change = run(change)

    assert change.state == "failed" and change.outcome.endswith("Nothing was changed.")
    assert "one operation at a time" in change.outcome
    assert steps(change)[-1] == ("restart", "failed") and host.applied == []


def test_a_rollback_asked_before_the_pipeline_starts(operator, approver, deployment, host, bench):
    change = applying(operator, approver, deployment)
    ChangeRequest.objects.filter(pk=change.pk).update(rollback_requested=True)

    change = run(change)

    assert change.state == "failed"
    assert change.outcome.endswith("Nothing had been changed.")
    assert steps(change) == [("rollback", "skipped")] and host.applied == []


# --- failures after the restart: rolled back -----------------------------------------------------
def test_the_host_already_rolled_back_an_engine_that_did_not_start(
    operator, approver, deployment, host, health, bench
):
    host.script = [ApplyOutcome("rolled_back", error="CUDA out of memory", log_lines=["OOM"])]

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back"
    assert change.outcome == "v2 failed to start: CUDA out of memory"
    assert steps(change)[-3:] == [
        ("restart", "started"),
        ("restart", "failed"),
        ("rollback", "succeeded"),
    ]
    assert versions(host) == [128]  # not a second time: the host did it


def test_an_engine_that_failed_outright_is_rolled_back_by_the_pipeline(
    operator, approver, deployment, host, health, bench
):
    host.script = [ApplyOutcome("failed", error="exited 1")]

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back" and change.outcome == "v2 failed to start: exited 1"
    assert versions(host) == [128, 64]
    assert steps(change)[-3:] == [
        ("restart", "failed"),
        ("rollback", "started"),
        ("rollback", "succeeded"),
    ]
    deployment.refresh_from_db()
    assert deployment.active_config == change.snapshot_config


def test_an_unhealthy_engine_is_rolled_back(operator, approver, deployment, host, health, bench):
    health.append("/v1/models lists no model")

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back"
    assert change.outcome == "the engine is not healthy on v2: /v1/models lists no model"
    assert ("health", "failed") in steps(change) and versions(host) == [128, 64]
    assert bench.calls == ["baseline"]


def test_a_regression_is_rolled_back(operator, approver, deployment, host, health, bench):
    bench.numbers["verification"]["ttft_p95_ms"] = 900.0

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back" and change.outcome.startswith("regression: TTFT p95")
    assert ("compare", "failed") in steps(change) and versions(host) == [128, 64]
    assert change.comparison["regressed"] is True


def test_a_failed_verification_is_rolled_back(operator, approver, deployment, host, health, bench):
    bench.status["verification"] = "failed"

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back"
    assert change.outcome == "the verification benchmark failed: engine gone"
    assert ("verify", "failed") in steps(change)


def test_a_rollback_that_fails_too_leaves_the_change_failed_and_says_so(
    operator, approver, deployment, host, health, bench
):
    health.append("no answer")
    host.script = [ApplyOutcome("ready"), ApplyOutcome("failed", error="GPU fell off the bus")]

    change = run(applying(operator, approver, deployment))

    assert change.state == "failed"
    assert "the rollback to v1 failed too: GPU fell off the bus" in change.outcome
    assert steps(change)[-1] == ("rollback", "failed")


def test_a_rollback_asked_during_the_verification(
    operator, approver, deployment, host, health, bench
):
    bench.during["verification"] = ask_for_rollback

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back"
    assert change.outcome == "a rollback was requested during the verification"
    assert versions(host) == [128, 64]
    assert not any(name == "compare" for name, _ in steps(change))


def test_a_rollback_asked_before_the_apply_finds_nothing_to_restart(
    operator, approver, deployment, host, health, bench
):
    bench.during["baseline"] = ask_for_rollback

    change = run(applying(operator, approver, deployment))

    assert change.state == "rolled_back"
    assert change.outcome == "a rollback was requested before the apply"
    assert steps(change)[-1] == ("rollback", "skipped") and host.applied == []
    assert change.applied_config is None


def test_a_rollback_the_host_refuses_leaves_the_change_failed_and_says_so(
    operator, approver, deployment, host, health, bench, monkeypatch
):
    def busy_meanwhile(deployment, config=None):
        # Someone else's restart started between the apply and the health check.
        EngineOperation.objects.create(
            deployment=deployment, kind="restart", config=deployment.active_config, status="queued"
        )
        return "no answer"

    monkeypatch.setattr(verification, "health_problem", busy_meanwhile)

    change = run(applying(operator, approver, deployment))

    assert change.state == "failed"
    assert "the rollback could not start" in change.outcome
    assert "one operation at a time" in change.outcome
    assert steps(change)[-2:] == [("rollback", "started"), ("rollback", "failed")]
    assert versions(host) == [128]


# --- resume --------------------------------------------------------------------------------------
def test_resume_after_a_worker_died_in_the_health_check(
    operator, approver, deployment, host, health, bench, monkeypatch
):
    change = applying(operator, approver, deployment)

    def die(deployment, config=None):
        raise SystemExit("worker killed")

    with mock.patch.object(verification, "health_problem", die):
        with pytest.raises(SystemExit):
            run(change)
    change.refresh_from_db()
    assert change.state == "applying" and change.stage == "health"

    change = run(change)  # the same worker name: its own claim

    assert change.state == "applied"
    # Done stages are not run again: one snapshot, one baseline, one new version, one apply.
    assert steps(change).count(("snapshot", "succeeded")) == 1
    assert steps(change).count(("apply", "succeeded")) == 1
    assert bench.calls == ["baseline", "verification"] and versions(host) == [128]


def test_resume_after_the_verification_does_not_measure_again(
    operator, approver, deployment, host, health, bench
):
    change = applying(operator, approver, deployment)
    with mock.patch("changes.verdict.verdict", side_effect=SystemExit("worker killed")):
        with pytest.raises(SystemExit):
            run(change)
    change.refresh_from_db()
    assert change.state == "verifying" and change.verification_run is not None

    change = run(change)

    assert change.state == "applied"
    assert bench.calls == ["baseline", "verification"]
    assert steps(change).count(("restart", "succeeded")) == 1


def test_a_broken_stage_is_abandoned_by_the_task_with_the_engine_state(
    operator, approver, deployment, host, health, bench
):
    from changes import tasks

    change = applying(operator, approver, deployment)
    host.state = "ready"
    with mock.patch.object(verification, "health_problem", side_effect=KeyError("boom")):
        with pytest.raises(KeyError):
            tasks.apply_change.run(change.pk)

    change.refresh_from_db()
    assert change.state == "failed"
    assert change.outcome.startswith("the pipeline stopped during health: KeyError: 'boom'")
    assert "the engine was found ready" in change.outcome


# --- a new stage is one class --------------------------------------------------------------------
class QualityProbe(PipelineStage):
    """A stand-in for a stage added later: it fails and asks for a rollback."""

    stage = Stage.VERIFY

    def is_done(self, change):
        return False

    def run(self, change):
        self.record(change, StageStatus.STARTED, "probe")
        raise StageFailed("answers got worse: 71% → 52% exact match", rollback=True)


def test_a_new_stage_plugs_in_by_being_listed(operator, approver, deployment, host, health, bench):
    stage_list = (*stages.STAGES[:-1], QualityProbe(), stages.STAGES[-1])

    change = run(applying(operator, approver, deployment), stage_list)

    assert change.state == "rolled_back"
    assert change.outcome == "answers got worse: 71% → 52% exact match"
    assert ("verify", "failed") in steps(change) and versions(host) == [128, 64]
