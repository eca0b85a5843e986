"""Starting, stopping and resuming a change's apply pipeline (the pipeline itself runs on a
worker: ``changes.services.pipeline``). One change per deployment at a time: a row lock plus a
partial unique index on the states that hold the deployment's lock. A change holding it
occupies the deployment for everything else too (``occupants``, registered with
``hosts.services.occupancy`` by ``ChangesConfig.ready``): only its own pipeline restarts or
measures the engine until the change ends."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings as conf
from django.db import IntegrityError, transaction
from django.utils import timezone

from benchmarks.models import BenchmarkRun, ProbeRun
from benchmarks.services import runs as benchmark_runs
from changes import rules
from changes.choices import LOCK_STATES, ChangeState
from changes.models import PIPELINE, ChangeRequest
from changes.rules import ChangeRefused
from changes.services import review
from changes.services.timeline import locked, record, transition
from controlpanel import timelimits
from controlpanel.jobs import enqueue_on_commit
from hosts.models import Deployment, EngineOperation
from hosts.services import occupancy

S = ChangeState
TASK = "changes.tasks.apply_change"


def lock_holder(deployment: Deployment) -> ChangeRequest | None:
    """The change holding the deployment's lock (applying or verifying), if any."""
    return ChangeRequest.objects.filter(deployment=deployment, state__in=LOCK_STATES).first()


def occupants(deployment: Deployment) -> list[occupancy.Occupant]:
    """The ``occupancy`` holder of this app: the change holding the deployment's lock, whose
    parts (its benchmarks and engine operations) are its own pipeline's work."""
    holder = lock_holder(deployment)
    if holder is None:
        return []
    text = (
        f"It is locked by change #{holder.pk} ({holder.title}), "
        f"{holder.state_choice.label.lower()}: only the change's own pipeline restarts or "
        "measures the engine until the change ends."
    )
    return [occupancy.Occupant(holder, text, _parts(holder))]


def _parts(change: ChangeRequest) -> frozenset[occupancy.Key]:
    """Every benchmark run, quality probe and engine operation the change points at (its
    baseline, its restarts, its verification, its probes, its rollback): its pipeline's own
    work, read off the foreign keys so that a step added later is covered without being
    listed here."""
    return frozenset(
        (field.related_model._meta.label_lower, getattr(change, field.attname))
        for field in ChangeRequest._meta.concrete_fields
        if field.many_to_one
        and field.related_model in (BenchmarkRun, ProbeRun, EngineOperation)
        and getattr(change, field.attname) is not None
    )


def apply_change(actor, change: ChangeRequest) -> ChangeRequest:
    """Start the apply pipeline of an approved change: one change per deployment at a time
    (row lock + partial unique index), only in its maintenance window, never on a stale base,
    never while anything else uses the engine (``hosts.services.occupancy``: an operation, a
    benchmark, another change)."""
    with transaction.atomic():
        change = locked(change)
        rules.require("apply", actor, change)
        short = review.recount_approvals(actor, change)
    if short and change.state != S.APPROVED:
        raise ChangeRefused(f"Not applied: {short}. It is back in review.")
    try:
        with transaction.atomic():
            Deployment.objects.select_for_update(of=("self",)).get(pk=change.deployment_id)
            change = locked(change)
            rules.require("apply", actor, change)
            _check_engine_free(change)
            change.applied_by = actor
            change.rollback_requested = False
            change.save(update_fields=["applied_by", "rollback_requested", "updated_at"])
            record(actor, change, "apply", after={"message": "apply pipeline queued"})
            transition(actor, change, S.APPLYING)
            _enqueue(change)
    except IntegrityError:
        holder = lock_holder(change.deployment)
        raise ChangeRefused(
            _lock_message(holder) if holder else "Another change just started applying."
        ) from None
    return change


def _check_engine_free(change: ChangeRequest) -> None:
    """What other rows forbid: anything occupying the deployment (another change's lock, an
    operation or a benchmark: they would make the baseline and the verification measure a
    moving target), or being outside the window."""
    try:
        occupancy.require_free(change.deployment, occupancy.Purpose.CHANGE, owner=change)
    except occupancy.DeploymentBusy as busy:
        raise ChangeRefused(str(busy)) from None
    if not change.in_window():
        raise ChangeRefused(_window_message(change))


def _enqueue(change: ChangeRequest) -> None:
    enqueue_on_commit(TASK, change.pk, **time_limit(change).options())


def _lock_message(holder: ChangeRequest) -> str:
    return (
        f"{holder.deployment} is locked by change #{holder.pk} ({holder.title}), "
        f"{holder.state_choice.label.lower()}: one change at a time per deployment."
    )


def _window_message(change: ChangeRequest) -> str:
    fmt = "%Y-%m-%d %H:%M %Z"
    start = timezone.localtime(change.window_start).strftime(fmt) if change.window_start else "—"
    end = timezone.localtime(change.window_end).strftime(fmt) if change.window_end else "—"
    return f"Outside the change's maintenance window ({start} to {end})."


def time_limit(change: ChangeRequest) -> timelimits.TimeLimit:
    """The pipeline's limit: two benchmarks of its profile, three engine operations (the
    restart before the baseline, the apply, a rollback), the health check."""
    bench = benchmark_runs.time_limit_for(change.verify_profile) if change.verify_profile else 0
    return timelimits.pipeline(
        bench, timelimits.operation_budget(conf.ENGINE_READY_TIMEOUT), conf.CHANGE_HEALTH_TIMEOUT
    )


def request_rollback(actor, change: ChangeRequest, reason: str) -> ChangeRequest:
    """Ask for a roll back of a change that is applying or verifying, e.g. after its worker
    was lost: the pipeline (resumed now when none is alive) restores the snapshot config. A
    benchmark of the change that is running is cancelled, so the answer comes within seconds."""
    with transaction.atomic():
        change = locked(change)
        rules.require("rollback", actor, change)
        change.rollback_requested = True
        change.save(update_fields=["rollback_requested", "updated_at"])
        record(actor, change, "rollback_request", after={"message": reason or "by hand"})
    for run in (change.baseline_run, change.verification_run):
        if run is not None and run.cancellable:
            try:
                benchmark_runs.cancel_benchmark(actor, run)
            except benchmark_runs.RunRefused:
                pass  # it just finished: the pipeline sees the flag next
    if not change.pipeline_alive():
        resume_change(actor, change, quiet=True)
    return change


def resume_change(actor, change: ChangeRequest, *, quiet: bool = False) -> ChangeRequest:
    """Start the pipeline again for a change whose worker was lost (no heartbeat): it picks up
    after the last stage it finished, so the host ends on a known config with a record.
    ``actor`` None is beat's sweep."""
    with transaction.atomic():
        change = locked(change)
        rules.require("resume", actor, change)
        if not quiet:
            record(actor, change, "resume", after={"message": f"after stage {change.stage}"})
        _enqueue(change)
    return change


def resume_lost_pipelines() -> list[ChangeRequest]:
    """Beat's sweep: a change being applied whose pipeline stopped stamping it (its worker
    machine died and the broker has not redelivered yet) is resumed, so it reaches a known
    end without waiting for someone to notice. Pipelines that never started are left alone:
    their task may only be waiting for a free worker."""
    lost = PIPELINE.lost(
        ChangeRequest.objects.filter(state__in=LOCK_STATES), grace=timedelta(seconds=60)
    ).select_related("deployment")
    resumed = []
    for change in lost:
        try:
            resumed.append(resume_change(None, change))
        except ChangeRefused:
            continue  # it finished or came back to life meanwhile
    return resumed
