"""The apply pipeline's steps, one class each, run in the order of ``STAGES`` by
``pipeline.drive``.

A stage says whether it is already done for a change (``is_done``: resume skips it) and does
its work (``run``), recording its progress on the timeline. When it cannot go on it raises
``StageFailed``: the driver records the failure and then either rolls back to the snapshot
config (``rollback=True``: something was changed) or ends the change as failed (nothing was).
A new step — a quality probe, a sweep trial — is one more class listed in ``STAGES``.
"""

from __future__ import annotations

from django.db import transaction
from django.urls import reverse

from benchmarks.models import BenchmarkRun
from benchmarks.services.results import error_threshold_problem
from changes.choices import ChangeKind, ChangeState, Stage, StageStatus
from changes.models import ChangeRequest
from changes.rules import stale_message
from changes.services import verification
from changes.services.stage_base import (  # noqa: F401 - the pipeline's names, re-exported
    WHILE_APPLYING,
    PipelineStage,
    RollbackRequested,
    StageFailed,
    rollback_asked,
)
from changes.services.stage_base import measure_profile as _measure
from changes.services.stage_base import succeeded as _succeeded
from changes.services.stages_quality import QualityBaseline, QualityVerify
from changes.services.timeline import finish, transition
from hosts.choices import OperationOutcome
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations as host_operations

S = ChangeState


class Snapshot(PipelineStage):
    """Remember the running config: where any rollback goes. A change proposed against
    another config than the one running now is stale and changes nothing."""

    stage = Stage.SNAPSHOT

    def is_done(self, change):
        return change.snapshot_config_id is not None

    def run(self, change):
        self.record(change, StageStatus.STARTED)
        deployment = change.deployment
        deployment.refresh_from_db()
        running = deployment.active_config
        if running is None and change.base_config_id is not None:
            raise StageFailed("The deployment has no running config to return to.", rollback=False)
        if deployment.active_config_id != change.base_config_id:
            raise StageFailed(stale_message(change) + " Nothing was changed.", rollback=False)
        change.snapshot_config = running
        change.save(update_fields=["snapshot_config"])
        self.record(
            change,
            StageStatus.SUCCEEDED,
            f"v{running.version} is the last good config" if running else "no config yet",
            detail=_settings_text(running.flat() if running else {}),
        )


def _chosen_baseline(change: ChangeRequest) -> BenchmarkRun | None:
    """The baseline run chosen for the change (or measured by an earlier attempt), when it may
    be used for a verdict (``error_threshold_problem``); None: a fresh one is measured."""
    run = change.baseline_run
    return run if run is not None and error_threshold_problem(run) is None else None


class Prepare(PipelineStage):
    """Before a fresh baseline, restart the engine on its running config (the same operation
    path as the apply's restart), so the baseline starts from the state the verification
    will start from: a just-started engine with an empty prefix cache. Without it a baseline
    on a warm engine, replaying prompts an earlier run already sent, is served from the
    cache and makes any restarted config look slower (issue 14: "+1489 % TTFT p95").

    A restart, not a cache reset: vLLM serves ``/reset_prefix_cache`` only with
    ``VLLM_SERVER_DEV_MODE=1``, which also opens endpoints no production engine should
    have, and does not say whether the reset happened; a restart works on every engine and
    every transport and resets every cache, not only the prefix cache."""

    stage = Stage.PREPARE

    def is_done(self, change):
        if not change.verify_profile_id or change.applied_config_id is not None:
            return True
        if change.snapshot_config_id is None or _chosen_baseline(change) is not None:
            return True  # nothing runs to restart, or no baseline to measure
        operation = change.baseline_operation
        return operation is not None and operation.is_finished and change.baseline_run_id

    def run(self, change):
        config = change.snapshot_config
        operation = change.baseline_operation
        if operation is None or operation.is_finished:
            self.record(
                change,
                StageStatus.STARTED,
                f"restarting v{config.version} so that the baseline, like the verification, "
                "starts right after a restart (cold cache)",
            )
            try:
                operation = host_operations.request_operation(
                    change.applied_by, change.deployment, "restart", enqueue=False, owner=change
                )
            except host_operations.OperationRefused as exc:
                raise StageFailed(f"{exc} Nothing was changed.", rollback=False) from None
            change.baseline_operation = operation
            change.save(update_fields=["baseline_operation"])
        operation = run_inline(operation)
        if operation.outcome != OperationOutcome.READY:
            message = operation.error or operation.get_outcome_display()
            raise StageFailed(
                f"v{config.version} did not come back after the restart: {message}",
                rollback=False,
                reason=f"the restart of v{config.version} before the baseline failed: "
                f"{message}. No new config was applied; the engine needs attention.",
                detail=operation.engine_log[-4000:],
                link=reverse("hosts:operation", args=[operation.pk]),
            )
        # Ready by the host's readiness rule (the operation waited for it); the baseline's
        # load generator waits for the engine from where it sends, as the verification's does.
        self.record(change, StageStatus.SUCCEEDED, f"the engine runs v{config.version}, cold")


class Baseline(PipelineStage):
    """The same load on the running config, unless a usable baseline run was chosen (one that
    succeeded within its error threshold); a chosen run that is not usable is replaced by a
    fresh one, and said so."""

    stage = Stage.BASELINE

    def is_done(self, change):
        return not change.verify_profile_id or change.applied_config_id is not None

    def run(self, change):
        baseline = _chosen_baseline(change)
        if baseline is not None:
            self.record(
                change,
                StageStatus.SKIPPED,
                f"using {baseline} as the baseline",
                link=verification.link(baseline),
            )
            return
        if change.baseline_run is not None and change.baseline_run.is_finished:
            problem = error_threshold_problem(change.baseline_run)
            self.record(
                change,
                StageStatus.SKIPPED,
                f"{change.baseline_run} cannot be the baseline: {problem}; measuring a fresh one",
                link=verification.link(change.baseline_run),
            )
        self.measure(change, "baseline", rollback=False)


class NewVersion(PipelineStage):
    """The proposed settings become the deployment's next config version (a rollback change
    reuses the version it goes back to)."""

    stage = Stage.APPLY
    rollback_reason = "a rollback was requested before the apply"

    def is_done(self, change):
        return change.applied_config_id is not None

    def run(self, change):
        self.record(change, StageStatus.STARTED)
        if change.kind == ChangeKind.ROLLBACK and change.target_config_id:
            config = change.target_config
            message = f"going back to v{config.version}"
        else:
            config = EngineConfig.objects.create_next(
                change.deployment,
                change.settings,
                env=change.env,
                placement=change.placement,
                created_by=change.proposed_by,
                note=f"change #{change.pk}: {change.title}"[:200],
                model=change.model or None,
            )
            message = f"created v{config.version}"
        change.applied_config = config
        change.save(update_fields=["applied_config"])
        self.record(change, StageStatus.SUCCEEDED, message)


class Restart(PipelineStage):
    """Restart the engine with the new version on the host (stop, start, wait for ready).
    The agent or the SSH transport restarts the previous config itself when the new one does
    not come up: the rollback then only records that."""

    stage = Stage.RESTART
    rollback_reason = None

    def is_done(self, change):
        return change.state != S.APPLYING

    def run(self, change):
        config = change.applied_config
        operation = change.operation or self._request(change, config)
        operation = run_inline(operation)
        if operation.outcome != OperationOutcome.READY:
            message = operation.error or operation.get_outcome_display()
            raise StageFailed(
                f"v{config.version} did not start: {message}",
                rollback=True,
                reason=f"v{config.version} failed to start: {message}",
                detail=operation.engine_log[-4000:],
                link=reverse("hosts:operation", args=[operation.pk]),
            )
        self.record(
            change,
            StageStatus.SUCCEEDED,
            f"the engine runs v{config.version}",
            detail="\n".join(operation.engine_log.splitlines()[-10:]),
        )

    def _request(self, change, config) -> EngineOperation:
        self.record(change, StageStatus.STARTED, f"v{config.version}")
        try:
            operation = host_operations.request_operation(
                change.applied_by,
                change.deployment,
                "apply",
                config,
                enqueue=False,
                owner=change,
                note=_operation_note(change, config),
            )
        except host_operations.OperationRefused as exc:
            raise StageFailed(f"{exc} Nothing was changed.", rollback=False) from None
        change.operation = operation
        change.save(update_fields=["operation"])
        return operation


def _operation_note(change, config) -> str:
    # A rollback change's apply is a rollback on the host page too, not a plain apply.
    if change.kind != ChangeKind.ROLLBACK:
        return ""
    why = (change.rationale or "").strip().splitlines()
    return f"Rollback to v{config.version} (change #{change.pk}: {why[0] if why else 'proposed'})"


class Health(PipelineStage):
    """The panel's own look at the engine, from where benchmarks reach it. With a
    verification to come, the change moves on to verifying."""

    stage = Stage.HEALTH
    rollback_reason = None

    def is_done(self, change):
        return change.state != S.APPLYING

    def run(self, change):
        deployment, version = change.deployment, change.applied_config.version
        self.record(change, StageStatus.STARTED, deployment.engine_url)
        problem = verification.health_problem(deployment, change.applied_config)
        if problem:
            raise StageFailed(
                problem,
                rollback=True,
                reason=f"the engine is not healthy on v{version}: {problem}",
            )
        self.record(change, StageStatus.SUCCEEDED, "/health and /v1/models answer")
        if change.verify_profile_id:
            with transaction.atomic():
                transition(None, change, S.VERIFYING)


class Verify(PipelineStage):
    """The same load again on the new config."""

    stage = Stage.VERIFY

    def is_done(self, change):
        run = change.verification_run
        return bool(change.verify_profile_id) and _succeeded(run)

    def run(self, change):
        if not change.verify_profile_id:
            self.record(change, StageStatus.SKIPPED, "no verification profile chosen")
            return
        self.measure(change, "verification", rollback=True)


class Compare(PipelineStage):
    """The verification against the baseline, under the change's thresholds, once their
    conditions are shown to be the same (``verification.judge``): a regression (more errors,
    slower p95 TTFT or ITL beyond the limits, an unusable verification, a hard guard:
    preemptions or a saturated KV cache new under the change, an engine restart) rolls the
    change back. When only the run-to-run noise keeps a latency from being judged, the same
    load runs again on the new config, up to the change's ``max_extra_runs``, its requests
    pooled with the verification's, until the band is narrow enough. An inconclusive verdict
    (the noise still too wide, a warm cache against a cold one, another load, an unusable
    baseline, too few requests) leaves it applied and marked not verified (``Done``): the
    operator decides."""

    stage = Stage.COMPARE

    def is_done(self, change):
        return not change.verify_profile_id

    def run(self, change):
        self.record(change, StageStatus.STARTED)
        run = change.verification_run
        # Resumed after a lost worker: an extra run it left running counts, unpooled.
        verification.close_unfinished(change.extra_runs.all())
        result = verification.judge(change)
        while not result["regressed"] and result.get("measure_more"):
            spent = change.extra_runs.count()
            if spent >= change.max_extra_runs:
                break
            self.record(
                change,
                StageStatus.STARTED,
                f"{result['reason']}: measuring again, extra verification run {spent + 1} "
                f"of up to {change.max_extra_runs}",
            )
            extra = _measure(change, verification.EXTRA, rollback=True)
            self.record(
                change,
                StageStatus.SUCCEEDED,
                f"extra verification run {spent + 1}: {verification.run_numbers_text(extra)}",
                link=verification.link(extra),
            )
            result = verification.judge(change)
        change.comparison = result
        change.save(update_fields=["comparison"])
        link = verification.compare_link(change.baseline_run, run)
        if result["regressed"]:
            raise StageFailed("regression: " + result["reason"], rollback=True, link=link)
        status = (
            StageStatus.INCONCLUSIVE
            if result["outcome"] == "inconclusive"
            else StageStatus.SUCCEEDED
        )
        self.record(change, status, verification.verdict_text(result), link=link)


class Done(PipelineStage):
    """The change is applied; when its verification was inconclusive it is applied but not
    verified: the config stays (it came up healthy and nothing shows harm, and a rollback is
    itself a restart), the state, the outcome and the notification say it is unverified and
    why, and a rollback is one proposal away."""

    stage = Stage.DONE
    rollback_reason = None

    def is_done(self, change):
        return change.is_finished

    def run(self, change):
        version = change.applied_config.version
        text = f"{change.deployment} runs v{version}"
        comparison = change.comparison or {}
        unverified = []
        if comparison.get("outcome") == "inconclusive":
            unverified.append(str(comparison.get("reason")))
        quality = (change.quality_comparison or {}).get("change_verdict") or {}
        if quality.get("verdict") == "cannot tell":
            unverified.append(f"the quality probe cannot tell: {quality.get('reason')}")
        if unverified:
            # Never "applied" on evidence that cannot tell: the operator decides.
            text += ", not verified: " + "; ".join(unverified) + ". " + DECIDE.format(version)
            self.record(change, StageStatus.INCONCLUSIVE, text)
            return finish(change, S.UNVERIFIED, text)
        self.record(change, StageStatus.SUCCEEDED, text)
        finish(change, S.APPLIED, text)


# The end of an unverified change's outcome: the panel could not judge, so a person decides.
DECIDE = "Your decision: keep v{} as it runs, or propose a rollback."


def run_inline(operation: EngineOperation) -> EngineOperation:
    """Run (or, after a lost worker, close) an engine operation here on the pipeline's
    worker."""
    if not operation.is_finished:
        host_operations.run_operation(
            EngineOperation.objects.select_related(
                "deployment__host", "config", "previous_config", "requested_by"
            ).get(pk=operation.pk)
        )
    operation.refresh_from_db()
    return operation


def _settings_text(flat: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(flat.items()))


STAGES: tuple[PipelineStage, ...] = (
    Snapshot(),
    Prepare(),
    Baseline(),
    QualityBaseline(),
    NewVersion(),
    Restart(),
    Health(),
    Verify(),
    Compare(),
    QualityVerify(),
    Done(),
)
