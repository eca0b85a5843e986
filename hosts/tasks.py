"""Celery tasks of the hosts app. Each takes a primary key and records its outcome on the row."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from hosts import services
from hosts.models import EngineOperation, HostCheck


@shared_task(time_limit=60, soft_time_limit=50)
def check_host(check_pk: int) -> None:
    check = HostCheck.objects.select_related("host").filter(pk=check_pk).first()
    if check is None or check.is_finished:
        return  # deleted or already handled (a redelivery after acks_late)
    try:
        services.run_host_check(check)
    except SoftTimeLimitExceeded:
        services.fail_host_check(check, "the check ran out of time")
    except Exception as exc:
        services.fail_host_check(check, f"{type(exc).__name__}: {exc}")
        raise


@shared_task(time_limit=120, soft_time_limit=110)
def check_all_hosts() -> int:
    return len(services.check_all_hosts())


# An apply may wait for the new engine and then for the rolled-back one: twice the ready
# timeout, plus stopping and starting.
OPERATION_SOFT_LIMIT = int(settings.ENGINE_READY_TIMEOUT * 2 + 120)


def _operation(operation_pk: int) -> None:
    operation = (
        EngineOperation.objects.select_related(
            "deployment__host", "config", "previous_config", "requested_by"
        )
        .filter(pk=operation_pk)
        .first()
    )
    if operation is None or operation.is_finished:
        return
    try:
        services.run_operation(operation)
    except SoftTimeLimitExceeded:
        services.fail_operation(operation, "the operation ran out of time")
    except Exception as exc:
        services.fail_operation(operation, f"{type(exc).__name__}: {exc}")
        raise


@shared_task(time_limit=OPERATION_SOFT_LIMIT + 30, soft_time_limit=OPERATION_SOFT_LIMIT)
def apply_config(operation_pk: int) -> None:
    _operation(operation_pk)


@shared_task(time_limit=OPERATION_SOFT_LIMIT + 30, soft_time_limit=OPERATION_SOFT_LIMIT)
def restart_engine(operation_pk: int) -> None:
    _operation(operation_pk)


@shared_task(time_limit=30, soft_time_limit=25, ignore_result=True)
def poll_telemetry() -> int:
    return services.poll_telemetry()


@shared_task(time_limit=300, soft_time_limit=280)
def downsample_telemetry() -> dict:
    return services.downsample_telemetry()
