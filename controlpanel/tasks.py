"""Celery tasks of the project itself. Limits: ``controlpanel.timelimits``."""

from celery import shared_task

from controlpanel import lostwork, timelimits


@shared_task(ignore_result=True, **timelimits.SWEEP_LOST_WORK.options())
def sweep_lost_work() -> dict:
    """The one lost-work sweep (``controlpanel.lostwork``), every minute."""
    return lostwork.sweep_lost_work()
