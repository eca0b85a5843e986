"""Celery tasks of the changes app. Each takes a primary key; ``controlpanel.jobs.run_job``
records a failure or a time limit on the change (its timeline), so a lost or broken worker
never leaves a change applying without a word."""

from celery import shared_task

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


# A sweep scrapes every engine at once (ADVISOR_SCRAPE_SECONDS) and then evaluates each
# deployment in milliseconds: well under a minute; the next beat replaces a late one.
DIAGNOSE_FLEET = timelimits.TimeLimit(50, 60)


@shared_task(ignore_result=True, **DIAGNOSE_FLEET.options())
def diagnose_fleet() -> dict:
    """The advisor's beat: re-evaluate every deployment whose host is online."""
    from changes.services import diagnosis

    return diagnosis.diagnose_fleet()
