"""Celery tasks of the changes app. Each takes a primary key; what happens is recorded on the
change (its timeline) so a lost worker never leaves a change without a word."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from changes import notify, services


# The time limit is set per call from the change (services.pipeline_time_limit); this default
# only covers a call made without one.
@shared_task(bind=True, time_limit=4 * 3600, soft_time_limit=4 * 3600 - 60)
def apply_change(self, change_pk: int) -> None:
    owner = f"{self.request.id or 'inline'}"
    try:
        services.run_pipeline(change_pk, owner)
    except SoftTimeLimitExceeded:
        services.abandon(change_pk, "the apply pipeline ran out of time")
    except Exception as exc:
        services.abandon(change_pk, f"{type(exc).__name__}: {exc}")
        raise


@shared_task(time_limit=60, soft_time_limit=50, ignore_result=True)
def notify_change(change_pk: int, state: str) -> None:
    notify.send(change_pk, state)


@shared_task(time_limit=60, soft_time_limit=50, ignore_result=True)
def resume_lost_pipelines() -> int:
    return len(services.resume_lost_pipelines())
