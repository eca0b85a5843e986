"""Celery tasks of the changes app. Each takes a primary key; ``controlpanel.jobs.run_job``
records a failure or a time limit on the change (its timeline), so a lost or broken worker
never leaves a change applying without a word."""

from celery import shared_task
from django.conf import settings

from changes import notify
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import pipeline
from controlpanel import timelimits
from controlpanel.jobs import run_job


# The limit is sent per call from the change (apply.time_limit); this default only covers
# a call made without one.
@shared_task(bind=True, **timelimits.DEFAULT_PIPELINE.options())
def apply_change(self, change_pk: int) -> None:
    owner = f"{self.request.id or 'inline'}"
    run_job(
        ChangeRequest.objects.all(),
        change_pk,
        lambda change: pipeline.run_pipeline(change.pk, owner),
        lambda change, error: pipeline.abandon(change.pk, error),
        what="the apply pipeline",
        finished=lambda change: not change.holds_lock,
    )


@shared_task(ignore_result=True, **timelimits.NOTIFY_CHANGE.options())
def notify_change(change_pk: int, state: str) -> None:
    notify.send(change_pk, state)


@shared_task(ignore_result=True, **timelimits.RESUME_LOST_PIPELINES.options())
def resume_lost_pipelines() -> int:
    return len(change_apply.resume_lost_pipelines())


# The predict phase scores every point of the space in virtual time: seconds to a minute
# for the largest space allowed.
PREDICT_SWEEP = timelimits.TimeLimit(570, 600)


@shared_task(ignore_result=True, **PREDICT_SWEEP.options())
def predict_sweep(sweep_pk: int) -> None:
    # Imported as the task runs: a web process queueing it loads this module, not the work's.
    from changes.models import Sweep
    from changes.services import sweep_prediction

    run_job(
        Sweep.objects.select_related("deployment__host", "base_config", "load_profile"),
        sweep_pk,
        sweep_prediction.predict,
        lambda sweep, error: sweep_prediction.fail_prediction(sweep.pk, error),
        what="the sweep's prediction",
        finished=lambda sweep: sweep.state != "predicting",
    )


# The limit is sent per lane from its sweep's budget (sweeps.lane_time_limit).
@shared_task(bind=True, ignore_result=True, **timelimits.DEFAULT_PIPELINE.options())
def run_sweep_lane(self, lane_pk: int) -> None:
    # Imported as the task runs: a web process queueing it loads this module, not the work's.
    from changes.models import SweepLane
    from changes.services import sweep_trials

    owner = f"{self.request.id or 'inline'}"
    run_job(
        SweepLane.objects.select_related("sweep", "deployment__host", "original_config"),
        lane_pk,
        lambda lane: sweep_trials.run_lane(lane.pk, owner),
        lambda lane, error: sweep_trials.abandon_lane(lane.pk, error),
        what="the sweep's trials",
        finished=lambda lane: not lane.holds_lock,
    )


# A restore waits for the engine's start, like any engine operation.
@shared_task(ignore_result=True, **timelimits.operation(settings.ENGINE_READY_TIMEOUT).options())
def retry_restore(lane_pk: int) -> None:
    """One try of a sweep lane's pending restore (``sweep_trials.retry_restore``)."""
    # Imported as the task runs: a web process queueing it loads this module, not the work's.
    from changes.services import sweep_trials

    sweep_trials.retry_restore(lane_pk)


@shared_task(ignore_result=True, **timelimits.RESUME_LOST_PIPELINES.options())
def resume_lost_sweep_lanes() -> int:
    """Lanes whose worker died go on on a new worker (``controlpanel.lostwork`` runs the
    same pass every minute)."""
    # Imported as the task runs: a web process queueing it loads this module, not the work's.
    from changes.services import sweep_trials

    return sweep_trials.resume_lost_lanes()


# A sweep scrapes every engine at once (ADVISOR_SCRAPE_SECONDS) and then evaluates each
# deployment in milliseconds: well under a minute; the next beat replaces a late one.
DIAGNOSE_FLEET = timelimits.TimeLimit(50, 60)


@shared_task(ignore_result=True, **DIAGNOSE_FLEET.options())
def diagnose_fleet() -> dict:
    """The advisor's beat: re-evaluate every deployment whose host is online."""
    # Imported as the task runs: a web process queueing it loads this module, not the work's.
    from changes.services import diagnosis

    return diagnosis.diagnose_fleet()
