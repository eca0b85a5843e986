"""The worker's side of a change: claim its pipeline, keep its heartbeat, drive its stages
(``stages.STAGES``) and, when one fails, put the last good config back.

Resume is the same loop: a stage already done for the change is skipped, so a pipeline taken
over from a lost worker continues after the last step that finished.
"""

from __future__ import annotations

import logging
import time
import uuid

from django.conf import settings as conf

from benchmarks.services import runs as benchmark_runs
from changes.choices import LOCK_STATES, ChangeState, Stage, StageStatus
from changes.models import PIPELINE, ChangeRequest
from changes.services import stages as pipeline_stages
from changes.services.stages import WHILE_APPLYING, RollbackRequested, StageFailed, run_inline
from changes.services.timeline import finish, record_stage
from hosts.choices import OperationOutcome
from hosts.services import operations as host_operations
from hosts.services import transports as host_transports

log = logging.getLogger(__name__)
S = ChangeState


# --- claiming ----------------------------------------------------------------------------------
def claim(change_pk: int, owner: str, wait_s: float | None = None) -> ChangeRequest | None:
    """Take the change's pipeline for ``owner``. A claim whose heartbeat is fresh belongs to a
    live worker: wait (a redelivery right after a crash) up to ``wait_s``, then give up."""
    if wait_s is None:
        wait_s = ChangeRequest.stale_after().total_seconds() + conf.CHANGE_HEARTBEAT_SECONDS
    deadline = time.monotonic() + wait_s
    while True:
        change = PIPELINE.take(ChangeRequest.objects.all(), change_pk, owner)
        if change is not None:
            return change
        if not ChangeRequest.objects.filter(pk=change_pk, state__in=LOCK_STATES).exists():
            return None  # gone or finished: nothing to wait for
        if time.monotonic() >= deadline:
            return None
        time.sleep(1)


def run_pipeline(change_pk: int, owner: str | None = None, stages=None) -> ChangeRequest | None:
    """The worker's part: claim the change, then run (or resume) its stages."""
    owner = owner or uuid.uuid4().hex
    change = claim(change_pk, owner)
    if change is None:
        return None
    with PIPELINE.beating(ChangeRequest.objects.all(), change.pk, owner, f"change-{change.pk}"):
        drive(
            ChangeRequest.objects.select_related(
                "deployment__host", "base_config", "snapshot_config", "applied_config"
            ).get(pk=change.pk),
            pipeline_stages.STAGES if stages is None else stages,
        )
    change.refresh_from_db()
    return change


# --- the loop ----------------------------------------------------------------------------------
def drive(change: ChangeRequest, stages) -> None:
    """Run each stage not done yet, in order. A failed stage is recorded, then the change is
    rolled back (something was changed) or failed (nothing was); a rollback request found
    between stages rolls back at once."""
    stage = None
    try:
        if change.rollback_requested:
            raise RollbackRequested(WHILE_APPLYING)
        for stage in stages:
            if change.is_finished:
                return
            if stage.is_done(change):
                continue
            if stage.rollback_reason and pipeline_stages.rollback_asked(change):
                raise RollbackRequested(stage.rollback_reason)
            stage.run(change)
    except RollbackRequested as asked:
        rollback(change, str(asked))
    except StageFailed as failure:
        record_stage(
            change,
            stage.stage,
            StageStatus.FAILED,
            failure.message,
            detail=failure.detail,
            link=failure.link,
        )
        if failure.rollback:
            rollback(change, failure.reason)
        else:
            finish(change, S.FAILED, failure.reason)


# --- rolling back ------------------------------------------------------------------------------
def rollback(change: ChangeRequest, reason: str) -> None:
    """Put the snapshot (last good) config back and record how that went."""
    snapshot = change.snapshot_config
    if _host_rolled_back(change):
        # The host already restarted the previous config: say so, don't do it twice.
        message = (
            f"the host restarted the last good config v{snapshot.version}"
            if snapshot
            else "the host restarted the previous engine"
        )
        record_stage(change, Stage.ROLLBACK, StageStatus.SUCCEEDED, message)
        return finish(change, S.ROLLED_BACK, reason)
    if snapshot is None:
        record_stage(change, Stage.ROLLBACK, StageStatus.SKIPPED, "nothing was applied yet")
        return finish(change, S.FAILED, reason + " Nothing had been changed.")
    change.deployment.refresh_from_db()
    operation = change.rollback_operation
    if operation is None:
        if change.deployment.active_config_id == snapshot.pk and change.operation_id is None:
            record_stage(
                change, Stage.ROLLBACK, StageStatus.SKIPPED, "the engine was never restarted"
            )
            return finish(change, S.ROLLED_BACK, reason)
        operation = _request_rollback(change, snapshot, reason)
        if operation is None:
            return None
    operation = run_inline(operation)
    if operation.outcome == OperationOutcome.READY:
        message = f"the engine runs v{snapshot.version}"
        record_stage(change, Stage.ROLLBACK, StageStatus.SUCCEEDED, message)
        return finish(change, S.ROLLED_BACK, reason)
    message = (
        f"{reason}; the rollback to v{snapshot.version} failed too: "
        f"{operation.error or operation.get_outcome_display()}"
    )
    detail = operation.engine_log[-4000:]
    record_stage(change, Stage.ROLLBACK, StageStatus.FAILED, message, detail=detail)
    return finish(change, S.FAILED, message)


def _host_rolled_back(change: ChangeRequest) -> bool:
    """The change's apply failed and the host put the previous engine back itself."""
    operation = change.operation
    if operation is None or change.rollback_operation_id is not None:
        return False
    operation.refresh_from_db(fields=["outcome"])
    return operation.outcome == OperationOutcome.ROLLED_BACK


def _request_rollback(change: ChangeRequest, snapshot, reason: str):
    """The rollback's engine operation, on the change; None (and the change failed) when
    the host refuses it."""
    message = f"back to v{snapshot.version}: {reason}"
    record_stage(change, Stage.ROLLBACK, StageStatus.STARTED, message)
    try:
        operation = host_operations.request_operation(
            None,
            change.deployment,
            "apply",
            snapshot,
            enqueue=False,
            owner=change,
            note=f"Rollback to v{snapshot.version} (change #{change.pk}: {reason})",
        )
    except host_operations.OperationRefused as exc:
        message = f"{reason}; the rollback could not start: {exc}"
        record_stage(change, Stage.ROLLBACK, StageStatus.FAILED, message)
        finish(change, S.FAILED, message)
        return None
    change.rollback_operation = operation
    change.save(update_fields=["rollback_operation"])
    return operation


# --- when the pipeline itself breaks -----------------------------------------------------------
def abandon(change_pk: int, error: str) -> None:
    """The pipeline itself broke (a bug, a time limit): record it, with what the host runs,
    so the change is never left applying without a word."""
    change = ChangeRequest.objects.select_related("deployment__host").get(pk=change_pk)
    if not change.holds_lock:
        return
    _close_inline_work(change, f"the change's pipeline stopped: {error}")
    state = _engine_state(change)
    record_stage(
        change,
        Stage(change.stage) if change.stage else Stage.APPLY,
        StageStatus.FAILED,
        f"{error}; the engine was found {state}",
    )
    finish(
        change,
        S.FAILED,
        f"the pipeline stopped during {change.stage or 'the apply'}: {error}; the engine was "
        f"found {state} — resume is not possible, propose a rollback if needed",
    )


def _close_inline_work(change: ChangeRequest, why: str) -> None:
    """What this pipeline ran inline has no task of its own to close it: close it here, or
    the deployment would stay locked by a "running" operation or benchmark."""
    for operation in (change.baseline_operation, change.operation, change.rollback_operation):
        if operation is not None and not operation.is_finished:
            host_operations.fail_operation(operation, why)
    for run in (change.baseline_run, change.verification_run):
        if run is not None and not run.is_finished:
            benchmark_runs.fail_run(run, why)


def _engine_state(change: ChangeRequest) -> str:
    deployment = change.deployment
    try:
        with host_transports.transport_for(deployment.host, deployment) as transport:
            return transport.engine_status(deployment.name).get("state", "unknown")
    except Exception:  # noqa: BLE001 - the record is what matters here
        log.warning("could not read the engine state for change %s", change.pk, exc_info=True)
        return "unknown"
