"""Celery tasks of the scaling app. Limits: ``controlpanel.timelimits``."""

from celery import shared_task

from controlpanel import timelimits
from controlpanel.jobs import run_job
from scaling.models import WhatIfPlan
from scaling.services import signals, whatif


@shared_task(ignore_result=True, **timelimits.POLL_ENGINE_SIGNALS.options())
def poll_engine_signals() -> int:
    return signals.poll_signals()


@shared_task(**timelimits.WHAT_IF.options())
def run_what_if(plan_pk: int) -> None:
    run_job(
        WhatIfPlan.objects.select_related("deployment__host"),
        plan_pk,
        whatif.execute_plan,
        whatif.fail_plan,
        what="the what-if",
    )
